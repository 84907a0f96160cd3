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
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record

import ddp_utils as du
from ddp_utils import engine
from ddp_utils.data import DevicePrefetcher, check_dataset, create_dataloader, create_val_dataloader, load_hyp
from ddp_utils.engine.pretrained import foreign_resume_message, load_pretrained
from ddp_utils.progress import PROGRESS_MODES, set_progress_mode
from ddp_utils.yolo import (
    ComputeLoss,
    ForeignCheckpointError,
    Model,
    class_table,
    evaluate,
    fitness,
    scale_loss_gains,
)
from ddp_utils.yolo.finetune import check_img_size, freeze_indices, freeze_layers, grid_size, transfer_weights

# the data and model yaml errors are ValueErrors; these are what a wrong path, file or value raises
USER_ERRORS = (FileNotFoundError, ValueError, engine.CheckpointError, ForeignCheckpointError, du.DistEnvError)


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
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
    add("--resume", nargs="?", const=True, default=False, help="resume the latest run, or the given last.pt")
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
    add("--seed", type=int, default=0)
    add("--deterministic", action="store_true", help="deterministic algorithms (slower)")
    add("--requeue-signal", default=None, help="signal to save, requeue the SLURM job and exit (default USR1 "
        "under SLURM, or DDP_UTILS_REQUEUE_SIGNAL; 'none': off)")  # fmt: skip
    add("--progress", default=None, choices=PROGRESS_MODES, help="progress: a bar, plain lines every 10 s, or off "
        "(default: $DDP_UTILS_PROGRESS, else a bar on a terminal, plain lines in a file)")  # fmt: skip
    add("--dist-debug", action="store_true", help="check collectives across ranks, NCCL flight recorder on timeout")
    # torch.distributed.launch passes --local_rank; the rank always comes from the environment
    add("--local_rank", "--local-rank", type=int, default=-1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def usage_error(message: str) -> NoReturn:
    """A user's mistake: one line naming the value and what to do, exit code 2 (as argparse), no traceback.

    Under torchrun: printed by each node's first process only, and named in torchrun's failure report."""
    du.distributed.exit_usage_error(f"train.py: error: {message}")


def check_opt(opt: argparse.Namespace, info: du.DistInfo) -> None:
    """Refuse bad combinations before any process group starts."""
    if opt.batch_size < 1 and opt.batch_size != -1:
        usage_error(f"--batch-size {opt.batch_size}: give the total batch size, a positive integer, or -1 (AutoBatch)")
    if opt.batch_size != -1 and opt.batch_size % info.world_size:
        usage_error(
            f"--batch-size {opt.batch_size} does not divide by WORLD_SIZE={info.world_size}: "
            f"use a multiple of {info.world_size}"
        )
    if opt.image_weights and info.world_size > 1:
        usage_error("--image-weights works in a single process only: drop it or run without torchrun")
    if opt.epochs is not None and opt.epochs < 1:
        usage_error(f"--epochs {opt.epochs}: train at least one epoch")
    if opt.sync_bn and info.world_size == 1:
        du.LOGGER.warning("--sync-bn has no effect in a single process")
    if opt.rect and opt.multi_scale:
        usage_error("--rect and --multi-scale do not go together: rect batches have fixed shapes")
    try:
        engine.signals.requeue_signal(opt.requeue_signal)
    except ValueError as exc:
        usage_error(str(exc))


def resolve_run(opt: argparse.Namespace, info: du.DistInfo) -> tuple[argparse.Namespace, dict | None]:
    """When resuming, find and load the checkpoint to continue from (rank 0 decides, all follow).

    An elastic restart (torchrun --max-restarts) resumes its own run by itself, found by a
    key of this launch recorded in opt.yaml. A new run's directory is made later, by make_run_dir.
    """
    run_key = du.launch_key(info)  # the same across elastic restarts and SLURM requeues of this job
    last = None
    if info.is_main:
        if opt.resume:
            last = Path(opt.resume) if isinstance(opt.resume, str) else engine.latest_checkpoint(opt.project)
        elif info.restart_count > 0:
            last = engine.latest_checkpoint(opt.project, run_key=run_key)
            if last is None:
                du.LOGGER.warning(f"elastic restart {info.restart_count}: no last.pt of this run yet, starting over")
    # every rank raises the same error, or none
    last, exists = du.broadcast_object((str(last), Path(last).is_file()) if last is not None else (None, False))
    if opt.resume and last is None:
        raise FileNotFoundError(f"--resume: no {opt.project}/*/weights/last.pt to resume; give the path")
    if last is not None and not exists:
        raise FileNotFoundError(f"--resume {last}: no such checkpoint; give the path of a run's weights/last.pt")
    opt.run_key = run_key
    if last is None:
        return opt, None
    if all(du.all_gather_object(Path(last).is_file())):
        ckpt = load_pretrained(last)
    else:  # nodes without a shared file system get rank 0's copy
        ckpt = du.broadcast_object(load_pretrained(last) if info.is_main else None)
    if ckpt.get("foreign"):
        raise ValueError(foreign_resume_message(last))
    resumed = argparse.Namespace(**{**vars(parse_opt([])), **ckpt["opt"]})  # options added since keep defaults
    resumed.resume, resumed.weights, resumed.run_key = last, last, run_key
    resumed.save_dir = str(Path(last).parent.parent)
    du.LOGGER.info(f"resuming {resumed.save_dir} from epoch {ckpt['epoch'] + 2}")
    return resumed, ckpt


def main(opt: argparse.Namespace) -> None:
    info = du.dist_info()
    du.set_logging(info.rank)
    set_progress_mode(opt.progress)
    check_opt(opt, info)
    try:  # the device decides the backend; a device that is not there is one line, before any rendezvous
        device = du.select_device(opt.device, batch_size=opt.batch_size if opt.batch_size > 0 else None)
    except USER_ERRORS as exc:
        usage_error(str(exc))
    if opt.dist_debug:  # before the group forms: torch wraps it to check every collective across ranks
        du.distributed.enable_debug(Path(opt.project) / "dist_debug")
    du.init_distributed(device=device)
    finished = False
    try:
        try:  # ---- inputs: a user's mistake is one line and exit code 2, before any run directory ----
            opt, ckpt = resolve_run(opt, info)
            run = setup(opt, device, info, ckpt)
        except USER_ERRORS as exc:
            du.LOGGER.debug("the user error's traceback", exc_info=True)
            usage_error(str(exc))
        train(run, opt, info)
        finished = True
    finally:
        du.cleanup(wait=finished)  # on an error, leave at once: the others fail fast, not hang


def setup(opt: argparse.Namespace, device: torch.device, info: du.DistInfo, ckpt: dict | None) -> SimpleNamespace:
    """Data, model and loaders from the user's inputs, checked; then the run directory."""
    # ---- data and hyperparameters (the node's first process downloads or generates the data) ----
    data = check_dataset(opt.data)
    defaults = data.get("train_defaults", {})
    opt.epochs = opt.epochs or defaults.get("epochs", 100)
    opt.hyp = opt.hyp or defaults.get("hyp", "hyp.scratch-low.yaml")
    hyp = load_hyp(opt.hyp) if isinstance(opt.hyp, str) else dict(opt.hyp)  # what the run uses, unchanged
    nc = 1 if opt.single_cls else int(data["nc"])
    names = {0: "item"} if opt.single_cls and len(data["names"]) != 1 else data["names"]
    opt.amp = engine.resolve_amp(opt.amp, device)
    du.init_seeds(du.rank_seed(opt.seed, info.rank), deterministic=opt.deterministic)
    du.set_cudnn_mode(opt.deterministic)  # from the flag alone: every rank the same, whatever its seed

    # ---- model: pretrained tensors where name and shape match, frozen layers, size on the stride ----
    if ckpt is None and opt.weights:
        ckpt = load_pretrained(opt.weights)  # a YOLOv5 checkpoint too, read without running it
    model = Model(ckpt["model_cfg"] if ckpt else opt.cfg, ch=3, nc=nc).to(device)
    if ckpt is not None and not opt.resume:
        done, total = transfer_weights(model, ckpt["model"])
        du.LOGGER.info(f"transferred {done}/{total} tensors from {opt.weights}")
    freeze_layers(model, freeze_indices(opt.freeze))
    gs = grid_size(model)
    opt.imgsz = opt.imgsz or defaults.get("imgsz", 640)
    imgsz = check_img_size(opt.imgsz, gs)
    if info.is_main:
        du.model_info(model, imgsz=imgsz)  # YOLOv5's summary line: layers, parameters, gradients, GFLOPs
    if opt.batch_size == -1:  # AutoBatch: rank 0 measures what fits one GPU; every rank uses its answer
        per_rank = engine.check_train_batch_size(model, imgsz, amp=opt.amp != "off") if info.is_main else None
        opt.batch_size = du.broadcast_object(per_rank) * info.world_size

    # ---- loaders: each process loads batch_size / world_size images per step ----
    batch = opt.batch_size // info.world_size
    common = dict(single_cls=opt.single_cls, hyp=hyp, cache=opt.cache, rank=info.local_rank, workers=opt.workers)
    train_loader, dataset = create_dataloader(
        data["train"], imgsz, batch, gs, augment=True, rect=opt.rect, image_weights=opt.image_weights,
        quad=opt.quad, prefix="train: ", shuffle=True, seed=opt.seed, **common,
    )  # fmt: skip
    val_loader, _ = create_val_dataloader(data["val"], imgsz, batch * 2, gs, prefix="val: ", **common)
    dataset.check_classes(nc, opt.data)  # a label class >= nc: one line naming the label file
    make_run_dir(opt, info, hyp)
    return SimpleNamespace(
        device=device, info=info, ckpt=ckpt, hyp=hyp, nc=nc, names=names, model=model, gs=gs, imgsz=imgsz,
        batch=batch, dataset=dataset, train_loader=train_loader, val_loader=val_loader,
    )  # fmt: skip


def make_run_dir(opt: argparse.Namespace, info: du.DistInfo, hyp: dict) -> None:
    """Rank 0 claims project/nameN (unless resuming) and records the options and hyperparameters used."""
    if not opt.resume:
        run_dir = Path(opt.project) / opt.name
        new_dir = engine.increment_path(run_dir, exist_ok=opt.exist_ok, mkdir=True) if info.is_main else None
        opt.save_dir = str(du.broadcast_object(new_dir))
    if info.is_main:
        engine.yaml_save(Path(opt.save_dir) / "hyp.yaml", hyp)
        engine.yaml_save(Path(opt.save_dir) / "opt.yaml", vars(opt))
        du.LOGGER.info("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hyp.items()))


def build_training(run: SimpleNamespace, opt: argparse.Namespace, info: du.DistInfo) -> SimpleNamespace:
    """Optimizer, schedule, EMA, loss and the DDP wrapper; a resumed run's state put back."""
    model, hyp = run.model, run.hyp
    channels_last = engine.use_channels_last(run.device)  # CUDA's convolutions run much faster so; the CPU's do not
    if channels_last:  # before the optimizer and DDP, which keep the parameters' layout
        engine.to_channels_last(model)
    # ---- optimizer: gradients accumulate up to the nominal batch size, decay scales with it ----
    nbs = int(hyp.get("nbs", engine.NBS))
    accumulate = engine.accumulate_steps(opt.batch_size, nbs)
    weight_decay = engine.scaled_weight_decay(hyp["weight_decay"], opt.batch_size, accumulate, nbs)
    optimizer = engine.smart_optimizer(model, opt.optimizer, hyp["lr0"], hyp["momentum"], weight_decay)
    lf = engine.lr_lambda(hyp["lrf"], opt.epochs, cos_lr=opt.cos_lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    ema = engine.ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=opt.amp == "fp16")  # bf16 needs no loss scaling
    start_epoch, best_fitness = 0, 0.0
    if opt.resume:
        start_epoch, best_fitness = engine.restore_training(run.ckpt, model, optimizer, ema, scaler)
    scheduler.last_epoch = start_epoch - 1

    # ---- loss: gains scaled to the model and size; class biases from the label counts ----
    loss_hyp = scale_loss_gains(hyp, engine.de_parallel(model).model[-1].nl, run.nc, run.imgsz, opt.label_smoothing)
    if run.ckpt is None:
        ema = engine.init_class_biases(model, run.dataset.labels, run.nc)  # the EMA starts from these biases
    compute_loss = ComputeLoss(model, loss_hyp, across_ranks=True)  # normalised by the whole global batch

    # ---- SyncBatchNorm and DDP (it broadcasts rank 0's weights), then compile on request (Dynamo sees DDP) ----
    if channels_last:
        engine.to_channels_last(ema.ema)
    # under --dist-debug on gloo, DDP needs a group of its own (see ddp_utils.distributed.debug); else None
    group = du.distributed.ddp_process_group() if info.distributed else None
    model = engine.wrap_model(model, run.device, distributed=info.distributed, sync_bn=opt.sync_bn,
                              compile=opt.compile, process_group=group)  # fmt: skip
    warmup = engine.Warmup(optimizer, lf, len(run.train_loader), hyp["warmup_epochs"], hyp["warmup_bias_lr"],
                           hyp["warmup_momentum"], hyp["momentum"], int(hyp.get("warmup_min_iters", 100)))  # fmt: skip
    multi_scale = (run.imgsz, run.gs, opt.seed) if opt.multi_scale else None
    step = engine.TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate, warmup, opt.amp,
                            info.world_size, multi_scale, channels_last)  # fmt: skip
    return SimpleNamespace(step=step, scheduler=scheduler, start_epoch=start_epoch, best_fitness=best_fitness)


def train(run: SimpleNamespace, opt: argparse.Namespace, info: du.DistInfo) -> dict:
    save_dir, fit = Path(opt.save_dir), build_training(run, opt, info)
    step, start_epoch, best_fitness = fit.step, fit.start_epoch, fit.best_fitness
    if start_epoch >= opt.epochs:
        du.LOGGER.info(f"{opt.resume} has finished all {opt.epochs} epochs: nothing to resume")
        return {}

    # ---- logging and checkpoints (they write on rank 0 only) ----
    logger = engine.ResultsLogger(save_dir, start_epoch=start_epoch)
    if start_epoch == 0 and not opt.noplots:
        engine.plot_labels(run.dataset.labels, run.names, save_dir)
    stopper = engine.EarlyStopping(patience=opt.patience)
    if start_epoch:
        stopper.best_fitness, stopper.best_epoch = best_fitness, start_epoch - 1
    checkpoints = engine.Checkpointer(save_dir, opt, run.hyp, save_period=opt.save_period)
    du.LOGGER.info(
        f"image size {run.imgsz}, {info.world_size} process(es) x {run.batch} images, accumulate {step.accumulate}, "
        f"amp {opt.amp}, {len(run.dataset)} training images, {opt.epochs} epochs, logging to {save_dir}"
    )

    # ---- the training loop ----
    # the last validation's (metrics, val_loss): epochs skipped by --noval report them again, as results.csv did
    last_val, epoch = ({"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.0}, torch.zeros(3)), start_epoch
    requeue = engine.signals.requeue_signal(opt.requeue_signal)  # checked by check_opt
    with engine.PreemptionHandler(requeue_signals=(requeue,) if requeue else ()) as preemption:
        for epoch in range(start_epoch, opt.epochs):
            run.train_loader.set_epoch(epoch)
            plot = plot_first_batches(save_dir, run.names, info.is_main and epoch == start_epoch and not opt.noplots)
            batches = DevicePrefetcher(run.train_loader, run.device, step.channels_last)  # on CUDA: copies overlap
            stats = engine.train_one_epoch(step, batches, epoch, run.device, epochs=opt.epochs,
                                           preemption=preemption, progress=info.is_main, on_batch=plot)  # fmt: skip
            lrs = [group["lr"] for group in step.optimizer.param_groups]
            fit.scheduler.step()
            train_loss = du.reduce_tensor(stats.loss, op="mean").cpu()
            if preemption.requested_anywhere():
                # the epoch is incomplete: save the previous one's state so resume redoes this epoch
                checkpoints.save(epoch - 1, step.model, step.ema, step.optimizer, step.scaler, best_fitness,
                                 periodic=False)  # fmt: skip
                du.LOGGER.warning(f"stopped by a signal during epoch {epoch + 1}: saved {checkpoints.last}; "
                                  f"continue with: python train.py --resume {checkpoints.last}")  # fmt: skip
                if preemption.requeue_anywhere():  # after rank 0 saved: the requeued job resumes from it
                    engine.signals.requeue_job()
                break
            last_val, best_fitness, stop = validate_and_checkpoint(
                run, opt, epoch, step, stats, train_loss, lrs, logger, stopper, checkpoints, best_fitness, last_val
            )
            if stop:
                break

    # ---- finish: rank 0 strips the optimizer from best.pt and draws the curves ----
    logger.close()
    metrics = last_val[0]
    if info.is_main and not preemption.requested():
        if checkpoints.best.exists():
            engine.strip_optimizer(checkpoints.best)
        if not opt.noplots:
            engine.plot_results(save_dir / "results.csv")
        du.LOGGER.info(f"{epoch - start_epoch + 1} epochs done; results in {save_dir}; "
                       f"final mAP@0.5 {metrics['map50']:.3f}, mAP@0.5:0.95 {metrics['map']:.3f}")  # fmt: skip
    return metrics


def plot_first_batches(save_dir: Path, names: dict, enabled: bool):
    """A ``engine.train_one_epoch`` callback drawing the first three batches to train_batch{i}.jpg."""

    def plot(i: int, imgs_uint8: torch.Tensor, targets: torch.Tensor, paths: list[str]) -> None:
        if i < 3:
            engine.plot_images(imgs_uint8, targets, save_dir / f"train_batch{i}.jpg", paths, names)

    return plot if enabled else None


def validate_and_checkpoint(run, opt, epoch, step, stats, train_loss, lrs, logger, stopper, checkpoints,
                            best_fitness, last_val) -> tuple[tuple, float, bool]:  # fmt: skip
    """Validate with the EMA weights on every rank's shard, log one line, save; returns (last_val, best, stop)."""
    final_epoch = epoch + 1 == opt.epochs
    metrics, val_loss = last_val
    if not opt.noval or final_epoch:
        step.ema.sync()  # BatchNorm statistics drift apart per rank; evaluate rank 0's
        metrics, val_loss = evaluate(step.ema.ema, run.val_loader, step.compute_loss, device=run.device, verbose=False)
        if opt.verbose or final_epoch:  # YOLOv5 val's table: all, then one row per class
            du.LOGGER.info(class_table(metrics, run.names, per_class=True if opt.verbose else None))
    fit = fitness(metrics)
    stop = engine.should_stop_everywhere(stopper(epoch, fit))
    best_fitness = max(best_fitness, fit)
    logger.log(epoch, engine.results_values(train_loss, metrics, val_loss, lrs))
    box, obj, cls = train_loss.tolist()
    du.LOGGER.info(
        f"epoch {epoch + 1}/{opt.epochs}: loss {box:.4f} {obj:.4f} {cls:.4f}, P {metrics['precision']:.3f} "
        f"R {metrics['recall']:.3f} mAP@0.5 {metrics['map50']:.3f} mAP@0.5:0.95 {metrics['map']:.3f}, "
        f"{stats.speed(run.info.world_size)}"
    )
    if not opt.nosave or final_epoch or stop:
        model, ema, optimizer, scaler = step.model, step.ema, step.optimizer, step.scaler
        checkpoints.save(epoch, model, ema, optimizer, scaler, best_fitness, best=best_fitness == fit)
    return (metrics, val_loss), best_fitness, stop


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        record(main)(parse_opt())  # torchrun's failure report shows an uncaught error's traceback
