"""Train a YOLOv5-style detector, on one CPU or many GPUs across many nodes.

    python train.py                                         # yolov5n on the synthetic shapes data, CPU
    torchrun --nproc_per_node 2 train.py --data shapes.yaml --epochs 3
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 \\
        --rdzv_backend c10d --rdzv_endpoint HOST:29400 --rdzv_id job1 train.py --data coco.yaml

The script tells the story of one run; every reusable piece comes from ddp_utils.
Under torchrun each process trains on its shard of every batch; DDP averages the
gradients, so all processes hold the same weights. Rank 0 logs, validates the
gathered predictions, and writes checkpoints and results.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from pathlib import Path
from typing import NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record

import ddp_utils as du
from ddp_utils import engine
from ddp_utils.data import (
    DevicePrefetcher,
    DownloadError,
    class_frequency,
    create_dataloader,
    create_val_dataloader,
    epoch_image_weights,
)
from ddp_utils.engine.checkpoint import load_pretrained
from ddp_utils.engine.optim_setup import optimizer_from_hyp
from ddp_utils.engine.resume import TrainState, find_resume
from ddp_utils.engine.run import (
    Run,
    Training,
    add_yolov5_options,
    check_options,
    make_run_dir,
    record_run,
    start_run,
    validate_options,
)
from ddp_utils.engine.run_report import epoch_line, finish_run, first_batches_plotter
from ddp_utils.engine.trackers import TRACKERS, Trackers
from ddp_utils.progress import PROGRESS_MODES, set_progress_mode
from ddp_utils.yolo import (
    ComputeLoss,
    ForeignCheckpointError,
    Model,
    ValidationInterrupted,
    class_maps,
    class_table,
    evaluate,
    fitness,
    scale_loss_gains,
)
from ddp_utils.yolo.finetune import check_img_size, freeze_indices, freeze_layers, grid_size, transfer_weights

# the data and model yaml errors are ValueErrors; these are what a wrong path, file or value raises
USER_ERRORS = (
    FileNotFoundError,
    ValueError,
    engine.CheckpointError,
    ForeignCheckpointError,
    du.DistEnvError,
    DownloadError,  # offline, a dataset that is not here yet: one line naming the URL
)
DIVERGED_EXIT_CODE = 3  # training stopped because its steps stayed non-finite (last.pt: the last finite state)


def parse_opt(argv: list[str] | bool | None = None, known: bool = False) -> argparse.Namespace:
    """The options from ``argv`` (default: the command line).

    ``known=True``, as YOLOv5's ``parse_opt(known=True)``: the options that train.py knows, the rest
    ignored (``parse_opt(True)``, YOLOv5's positional form, means the same).
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--weights", default="", help="checkpoint to start from, ours or YOLOv5's ('' trains from scratch)")
    add("--cfg", default="yolov5n.yaml", help="model yaml (configs/models/ or a path)")
    add("--data", default="shapes.yaml", help="dataset yaml (data/ or a path)")
    add("--hyp", default=None, help="hyperparameter yaml; default: the data yaml's, else hyp.scratch-low.yaml")
    add("--epochs", type=int, default=None, help="default: the data yaml's train_defaults, else 100")
    add("--batch-size", type=int, default=16, help="total batch size over all processes; -1: AutoBatch (GPU)")
    add("--imgsz", "--img", "--img-size", type=int, default=None, help="train/val size (px); default from data yaml")
    add("--rect", action="store_true", help="rectangular training batches")
    add(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        help="resume the latest run, or the given run directory (or its weights/last.pt)",
    )
    add("--nosave", action="store_true", help="only save the final checkpoint")
    add("--noval", action="store_true", help="only validate after the final epoch")
    add("--noplots", action="store_true", help="save no plots (labels, batches, results)")
    add("--verbose", action="store_true", help="the per-class table after every validation, not only the last")
    add("--cache", nargs="?", const="ram", default=None, choices=["ram", "disk"], help="cache images")
    add("--image-weights", action="store_true", help="sample images by class weights (single process)")
    add("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    add("--amp", default=None, choices=["fp16", "bf16", "off"], help="mixed precision; default fp16 on CUDA, else off")
    add("--compile", action="store_true", help="torch.compile the model (slow to start; off by default)")
    add("--multi-scale", action="store_true", help="vary image size +/- 50%%")
    add("--single-cls", action="store_true", help="train multi-class data as single-class")
    add("--optimizer", default="SGD", choices=["SGD", "Adam", "AdamW"])
    add("--sync-bn", action="store_true", help="SyncBatchNorm across processes (DDP only)")
    add("--workers", type=int, default=None, help="max data-loader workers per process (default: the cores' share)")
    add("--project", default="runs/train", help="save to project/name")
    add("--name", default="exp", help="save to project/name")
    add("--exist-ok", action="store_true", help="reuse project/name instead of incrementing")
    add("--quad", action="store_true", help="quad data loader")
    add("--cos-lr", action="store_true", help="cosine LR schedule")
    add("--label-smoothing", type=float, default=0.0)
    add("--patience", type=int, default=100, help="epochs without improvement before stopping (0: never)")
    add("--freeze", nargs="+", type=int, default=[0], help="freeze the first N layers, or the listed layers")
    add("--save-period", type=int, default=-1, help="also save epochN.pt every N epochs (-1: never)")
    add("--save-interval", type=float, default=30.0, help="minutes between mid-epoch saves of last.pt (0: never)")
    add("--seed", type=int, default=0)
    add("--deterministic", action="store_true", help="deterministic algorithms (slower)")
    add("--requeue-signal", help='save, requeue the SLURM job, exit on it (USR1 under SLURM, "none": off)')
    add("--trackers", nargs="+", default=[], choices=TRACKERS, help="also log to MLflow and/or Weights & Biases")
    add("--progress", choices=PROGRESS_MODES, help="a bar, plain lines every 10 s, or off (default: bar on a terminal)")
    add("--dist-debug", action="store_true", help="check collectives across ranks, NCCL flight recorder on timeout")
    add_yolov5_options(parser)  # the rest of YOLOv5's: they do nothing here, or are refused (check_options)
    # torch.distributed.launch passes --local_rank; the rank always comes from the environment
    add("--local_rank", "--local-rank", type=int, default=-1, help=argparse.SUPPRESS)
    if isinstance(argv, bool):  # YOLOv5's parse_opt(True)
        argv, known = None, known or argv
    return parser.parse_known_args(argv)[0] if known else parser.parse_args(argv)


def run(**kwargs) -> argparse.Namespace:
    """Train from Python, as YOLOv5's ``train.run(data="coco128.yaml", imgsz=320)``: the command line's known
    options with ``kwargs`` set over them, then :func:`main`; returns the options.

    Raises:
        TypeError: a name that is not one of train.py's options (YOLOv5 would set it and ignore it).
        ddp_utils.engine.OptionError: a value or combination the command line refuses (``imgsz=-5``, ``epochs=0``), a
            ``ValueError`` naming the option (``exc.option``), raised here instead of the command line's
            one line and exit code 2.
    """
    opt = parse_opt(known=True)
    unknown = sorted(set(kwargs) - set(vars(opt)))
    if unknown:
        raise TypeError(f"train.run: no option named {', '.join(unknown)} (python train.py --help lists them)")
    for name, value in kwargs.items():
        setattr(opt, name, value)
    validate_options(opt, du.dist_info().world_size)
    main(opt)
    return opt


def usage_error(message: str) -> NoReturn:
    """A user's mistake: one line (once per node), exit code 2, no traceback; torchrun's report names it."""
    du.distributed.exit_usage_error(f"train.py: error: {message}")


@contextlib.contextmanager
def user_errors():
    """A wrong path, file or value in the inputs: one line and exit code 2, before any run directory."""
    try:
        yield
    except USER_ERRORS as exc:
        du.LOGGER.debug("the user error's traceback", exc_info=True)
        usage_error(str(exc))
    except du.RankFailedError as exc:  # the node's first process met the mistake (and said it): end alike
        if not exc.leader_raised(*USER_ERRORS):
            raise
        usage_error(exc.leader_message)


def main(opt: argparse.Namespace) -> None:
    # ---- launch: the options checked, the device chosen, then the process group ----
    info = du.dist_info()
    du.set_logging(info.rank)
    set_progress_mode(opt.progress)
    with user_errors():  # bad combinations, a device that is not there: one line, before any rendezvous
        check_options(opt, info.world_size)
        device = du.select_device(opt.device, batch_size=opt.batch_size if opt.batch_size > 0 else None)
    if opt.dist_debug:  # before the group forms: torch wraps it to check every collective across ranks
        du.distributed.enable_debug(Path(opt.project) / "dist_debug")
    du.init_distributed(device=device)
    finished = False
    try:
        with user_errors():
            # ---- resume: every reason to refuse is checked before anything is written ----
            resume = find_resume(opt, info, defaults=vars(parse_opt([])))
            if resume is not None and resume.finished:  # nothing to do, nothing written
                finished = True
                return
            # ---- data: the data yaml and hyperparameters (loaders follow the model: they need its stride) ----
            run = start_run(resume.opt if resume else opt, info, device, resume)
            du.init_seeds(du.rank_seed(run.opt.seed, info.rank), deterministic=run.opt.deterministic)
            du.set_cudnn_mode(run.opt.deterministic)  # from the flag alone: every rank the same, whatever its seed
            # ---- model ----
            run, model, gs = build_model(run, device, info)
            train_loader, val_loader, dataset = build_loaders(run, info, gs)
        if resume is None:  # the inputs are good: claim a run directory
            run = run.replace(save_dir=make_run_dir(opt.project, opt.name, opt.exist_ok, info))
        record_run(run, info)
        # ---- optimizer, EMA, loss, DDP ----
        fit = build_training(run, model, device, info, gs, (train_loader, val_loader, dataset.labels))
        # ---- epochs, then finish ----
        train(run, fit, device, info)
        finished = True
    except engine.TrainingDiverged as exc:  # every rank alike, after last.pt was saved: one line, no traceback
        du.distributed.exit_usage_error(f"train.py: {exc}", code=DIVERGED_EXIT_CODE)
    finally:
        du.cleanup(wait=finished)  # on an error, leave at once: the others fail fast, not hang


def build_model(run: Run, device: torch.device, info: du.DistInfo) -> tuple[Run, torch.nn.Module, int]:
    """The model: pretrained tensors where name and shape match, frozen layers, the size on its stride."""
    opt = run.opt
    ckpt = run.resume.ckpt if run.resume else load_pretrained(opt.weights) if opt.weights else None
    model = Model(ckpt["model_cfg"] if ckpt else opt.cfg, ch=3, nc=run.nc).to(device)  # YOLOv5's files too
    if ckpt is not None and run.resume is None:
        done, total = transfer_weights(model, ckpt["model"])
        du.LOGGER.info(f"transferred {done}/{total} tensors from {opt.weights}")
    freeze_layers(model, freeze_indices(opt.freeze))
    gs = grid_size(model)
    if run.imgsz < gs:  # YOLOv5 would round it to 0 and fail deep in the loader
        raise ValueError(f"--imgsz {run.imgsz} is below the model's stride {gs}: use at least {gs}, a multiple of it")
    imgsz = check_img_size(run.imgsz, gs)
    if info.is_main:
        du.model_info(model, imgsz=imgsz)  # YOLOv5's summary line: layers, parameters, gradients, GFLOPs
    batch_size = run.batch_size
    if batch_size == -1:  # AutoBatch: rank 0 measures what fits one GPU; every rank uses its answer
        per_rank = engine.check_train_batch_size(model, imgsz, amp=run.amp != "off") if info.is_main else None
        batch_size = du.broadcast_object(per_rank) * info.world_size
    return run.replace(imgsz=imgsz, batch_size=batch_size), model, gs


def build_loaders(run: Run, info: du.DistInfo, gs: int) -> tuple:
    """Each process loads batch_size / world_size images per step; the labels are checked against nc."""
    opt, batch = run.opt, run.batch_size // info.world_size
    common = dict(single_cls=opt.single_cls, hyp=run.hyp, cache=opt.cache, rank=info.local_rank, workers=opt.workers)
    train_options = dict(rect=opt.rect, image_weights=opt.image_weights, quad=opt.quad, shuffle=True, seed=opt.seed)
    train_loader, dataset = create_dataloader(
        run.data["train"], run.imgsz, batch, gs, augment=True, prefix="train: ", **train_options, **common
    )
    val_loader, _ = create_val_dataloader(run.data["val"], run.imgsz, batch * 2, gs, prefix="val: ", **common)
    dataset.check_classes(run.nc, opt.data)  # a label class >= nc: one line naming the label file
    return train_loader, val_loader, dataset


def build_training(run: Run, model, device: torch.device, info: du.DistInfo, gs: int, data: tuple) -> Training:
    """Optimizer, schedule, EMA, loss and the DDP wrapper; a resumed run's state put back, to the batch."""
    train_loader, val_loader, labels = data
    channels_last = engine.use_channels_last(device)  # CUDA's convolutions run much faster so; the CPU's do not
    if channels_last:  # before the optimizer and DDP, which keep the parameters' layout
        engine.to_channels_last(model)
    if run.resume is None and not run.opt.weights:  # the head's class biases start at the label counts
        model.initialize_biases(class_frequency(labels, run.nc))
    opt, sizes = run.opt, dict(batch_size=run.batch_size, epochs=run.epochs, batches_per_epoch=len(train_loader))
    optim = optimizer_from_hyp(model, run.hyp, name=opt.optimizer, cos_lr=opt.cos_lr, **sizes)
    ema = engine.ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=run.amp == "fp16")  # bf16 needs no loss scaling
    state = TrainState()
    if run.resume is not None:
        state = engine.restore_training(run.resume.ckpt, model, optim.optimizer, ema, scaler)
        if state.batch and state.batches != len(train_loader):  # another dataset or batch size than it was saved with
            du.LOGGER.warning(f"the run stopped at {state.where()}, but an epoch has {len(train_loader)} batches now")
            state.batch = 0
    state = dataclasses.replace(state, batches=len(train_loader), batch_size=run.batch_size)
    optim.scheduler.last_epoch = state.epoch - 1  # the schedule follows the epoch (lr from the optimizer's state)
    loss_gains = scale_loss_gains(run.hyp, model.model[-1].nl, run.nc, run.imgsz, opt.label_smoothing)  # to model, size
    compute_loss = ComputeLoss(model, loss_gains, across_ranks=True)  # normalised over the global batch
    if channels_last:
        engine.to_channels_last(ema.ema)
    # SyncBatchNorm and DDP (it broadcasts rank 0's weights), then compile on request (Dynamo sees DDP);
    # under --dist-debug on gloo, DDP needs a group of its own (see ddp_utils.distributed.debug); else None
    group = du.distributed.ddp_process_group() if info.distributed else None
    wrap = dict(distributed=info.distributed, sync_bn=opt.sync_bn, compile=opt.compile, process_group=group)
    model = engine.wrap_model(model, device, **wrap)
    multi_scale = (run.imgsz, gs, opt.seed) if opt.multi_scale else None
    settings = dict(amp=run.amp, world_size=info.world_size, multi_scale=multi_scale, channels_last=channels_last)
    parts = (model, optim.optimizer, scaler, ema, compute_loss, optim.accumulate, optim.warmup)
    step = engine.TrainStep(*parts, **settings, last_opt_step=state.last_opt_step)  # after every wrapper: see its guard
    step.guard.counts[0] = state.skipped  # the run's skipped steps go on counting from a resume's
    return Training(step, optim.scheduler, train_loader, val_loader, labels, state)


def train(run: Run, fit: Training, device: torch.device, info: du.DistInfo) -> dict:
    """The epochs: train, validate, log, save; stop early, on a signal (save, requeue), when steps stay non-finite
    (save the last finite state, raise TrainingDiverged), or at the end.

    A signal (SIGTERM, the requeue signal, a first Ctrl-C) stops every rank after the same optimizer step, or
    cuts a validation short: last.pt records the batch, and --resume continues at the next one.
    """
    opt, step = run.opt, fit.step
    logger, stopper, checkpoints, control = open_records(run, fit, info)
    stats, stop = None, False
    with logger, control:  # an error: the trackers' runs FAILED
        for epoch in range(fit.state.epoch, run.epochs):
            skipped = control.skipped
            stats = train_epoch(run, fit, device, info, control, checkpoints)
            if control.epoch_end(step):  # a signal in the epoch or its last step, or non-finite steps: save first
                break
            lrs = [group["lr"] for group in step.optimizer.param_groups]
            train_loss = du.reduce_tensor(stats.loss, op="mean").cpu()
            try:
                metrics, val_loss = validate(run, fit, device, epoch, control)
            except ValidationInterrupted:  # a signal during validation: the trained epoch is saved, unvalidated
                control.stop_anywhere()
                break
            fit.scheduler.step()
            stop = du.any_rank(bool(stopper(epoch, fitness(metrics))))
            best = fitness(metrics) >= fit.state.best_fitness
            maps = class_maps(metrics, run.nc) if hasattr(metrics, "classes") else fit.state.last_val.get("maps")
            fit.state = fit.state.epoch_done(step.last_opt_step, stopper, metrics, val_loss, maps, control.skipped)
            logger.log(epoch, engine.results_values(train_loss, metrics, val_loss, lrs, control.skipped - skipped))
            line = epoch_line(epoch, run.epochs, train_loss, metrics, stats.speed(info.world_size))
            du.LOGGER.info(line + notes(epoch, stats, control.skipped - skipped))
            stats, stop = None, control.stop_anywhere() or stop  # a signal during the validation's last moments
            if not opt.nosave or fit.state.epoch == run.epochs or stop:
                save(fit, checkpoints, control, info, best=best)
            if stop:
                break
        if control.reason is not None:  # last.pt of where training stopped, on disk before the process ends
            stop_run(save(fit, checkpoints, control, info, stats) if stats else fit.state, checkpoints, control, info)
        checkpoints.wait()

    # ---- finish: rank 0 strips the optimizer from best.pt and draws the curves ----
    stopped = control.reason is not None
    if info.is_main and not stopped:
        finish_run(run.save_dir, fit.state.metrics()[0], epochs_done=fit.state.epoch, plots=not opt.noplots)
        logger.log_weights([checkpoints.best, checkpoints.last])
    logger.close(finished=not stopped)
    return fit.state.metrics()[0]


def train_epoch(run: Run, fit: Training, device: torch.device, info: du.DistInfo, control, checkpoints):
    """One epoch, or what a resumed one has left: the loader starts at the batch to continue at."""
    opt, state = run.opt, fit.state
    if opt.image_weights:  # YOLOv5's --image-weights: rare and badly detected classes drawn more often
        fit.train_loader.set_image_weights(epoch_image_weights(fit.labels, run.nc, state.last_val.get("maps")))
    fit.train_loader.set_epoch(state.epoch, start_batch=state.batch)
    batches = DevicePrefetcher(fit.train_loader, device, fit.step.channels_last)  # on CUDA: copies overlap

    def periodic_save(now: engine.EpochStats) -> None:  # every rank; rank 0 writes, in the background
        saved = save(fit, checkpoints, control, info, now)
        du.LOGGER.info(
            f"saved {checkpoints.last} at {saved.where()} (training waited {checkpoints.blocked_seconds:.2f} s)"
        )

    plot = first_batches_plotter(run.save_dir, run.names, info.is_main and state.epoch == 0 and not opt.noplots)
    return engine.train_one_epoch(
        fit.step,
        batches,
        state.epoch,
        device,
        start=state.batch,
        loss=state.rank_loss(info.rank, info.world_size),
        epochs=run.epochs,
        control=control,
        on_save=periodic_save,
        progress=info.is_main,
        on_batch=plot,
    )


def save(fit: Training, checkpoints, control, info: du.DistInfo, stats=None, best: bool = False) -> TrainState:
    """Every rank: last.pt of where training stands, at ``stats``' batch when given (a collective: the ranks'
    running losses are gathered); rank 0 writes it. Returns the state saved."""
    state = fit.state_at(stats, info.world_size, control.skipped)
    if info.is_main:
        checkpoints.save(state, fit.step, best=best)
    control.saved()
    return state


def stop_run(state: TrainState, checkpoints, control, info: du.DistInfo) -> None:
    """After the stop's save: wait until it is on disk, say so and how to continue; requeue; a divergence raises."""
    written = checkpoints.wait()
    last = checkpoints.last
    saved = f"saved {last} in {checkpoints.write_seconds:.1f} s" if written else f"could not save {last} (see above)"
    if control.reason == "diverged":
        raise engine.TrainingDiverged(
            f"training diverged at {state.where()}: {control.in_a_row} optimizer steps in a row had non-finite "
            f"gradients ({control.skipped} skipped in all); {saved}, the last finite state; lower the learning "
            "rate (hyp lr0) or look for bad labels"
        )
    if info.is_main:
        du.LOGGER.warning(f"stopped at {state.where()}: {saved}; continue with: python train.py --resume {last}")
    if control.requeue_anywhere():  # after rank 0 saved: the requeued job resumes from it
        engine.signals.requeue_job()


def notes(epoch: int, stats: engine.EpochStats, skipped: int) -> str:
    """The epoch line's notes: a resumed epoch, steps skipped for non-finite gradients."""
    resumed = f"; resumed at epoch {epoch + 1}, batch {stats.start}/{stats.batch}" if stats.start else ""
    return resumed + (f"; {skipped} optimizer step(s) skipped (non-finite gradients)" if skipped else "")


def open_records(run: Run, fit: Training, info: du.DistInfo) -> tuple:
    """results.csv, early stopping, the checkpoints (rank 0 writes), the run's control, and its summary line."""
    params = {"opt": run.options(), "hyp": run.hyp}
    trackers = Trackers(run.opt.trackers if info.is_main else [], run.save_dir, Path(run.opt.project), params)
    logger = engine.ResultsLogger(run.save_dir, fit.state.epoch, trackers=trackers, enabled=info.is_main)
    if run.resume is None and info.is_main and not run.opt.noplots:
        engine.plot_labels(fit.labels, run.names, run.save_dir)
    stopper = engine.EarlyStopping(patience=run.opt.patience)
    if fit.state.best_epoch >= 0:  # a resumed run counts its patience from its best epoch
        stopper.best_fitness, stopper.best_epoch = fit.state.best_fitness, fit.state.best_epoch
    checkpoints = engine.Checkpointer(run.save_dir, run.options(), run.hyp, run.opt.save_period, background=True)
    requeue = engine.signals.requeue_signal(run.opt.requeue_signal)  # checked by check_options
    control = engine.StepControl(
        signals=(signal.SIGTERM, signal.SIGINT),
        requeue_signals=(requeue,) if requeue else (),
        save_interval=0.0 if run.opt.nosave else run.opt.save_interval * 60,
        keeps_clock=info.is_main,  # rank 0's clock; the per-step all-reduce tells every rank
    )
    du.LOGGER.info(
        f"image size {run.imgsz}, {info.world_size} process(es) x {run.batch_size // info.world_size} images, "
        f"accumulate {fit.step.accumulate}, amp {run.amp}, {len(fit.train_loader.dataset)} training images, "
        f"{run.epochs} epochs, logging to {run.save_dir}"
    )
    return logger, stopper, checkpoints, control


def validate(run: Run, fit: Training, device: torch.device, epoch: int, control) -> tuple[dict, torch.Tensor]:
    """Validate the EMA weights on every rank's shard: (metrics, val_loss); --noval repeats the last ones.

    Raises:
        ValidationInterrupted: a stop signal arrived on some rank (every rank raises it).
    """
    final_epoch = epoch + 1 == run.epochs
    if run.opt.noval and not final_epoch:
        return fit.state.metrics()  # results.csv reports the last validation again, as YOLOv5's does
    fit.step.ema.sync()  # BatchNorm statistics drift apart per rank; evaluate rank 0's
    ema, loss = fit.step.ema.ema, fit.step.compute_loss
    metrics, val_loss = evaluate(ema, fit.val_loader, loss, device=device, verbose=False, stop=control.stop_requested)
    if run.opt.verbose or final_epoch:  # YOLOv5 val's table: all, then one row per class
        du.LOGGER.info(class_table(metrics, run.names, per_class=True if run.opt.verbose else None))
    return metrics, val_loss


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        try:
            record(main)(parse_opt())  # torchrun's failure report shows an uncaught error's traceback
        except KeyboardInterrupt:  # a second Ctrl-C (the first saves and stops after the step), or one before training
            print("train.py: interrupted by Ctrl-C", file=sys.stderr)
            sys.exit(130)  # 128 + SIGINT, as a shell reports it
