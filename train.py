"""Train a YOLOv5-style detector, on one CPU or many GPUs across many nodes.

    python train.py                                         # yolov5n on the synthetic shapes data, CPU
    torchrun --nproc_per_node 2 train.py --data shapes.yaml --epochs 3
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 \\
        --rdzv_backend c10d --rdzv_endpoint HOST:29400 --rdzv_id job1 train.py --data coco.yaml

The script tells the story of one run; every reusable piece comes from ddp_utils. Under torchrun each
process trains on its shard of every batch and DDP averages the gradients, so all hold the same weights;
each validates its shard of the held-out images; rank 0 logs and writes the checkpoints and results.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

import ddp_utils as du
from ddp_utils import engine, yolo
from ddp_utils.data import DevicePrefetcher, epoch_image_weights
from ddp_utils.progress import set_progress_mode
from ddp_utils.run import options
from ddp_utils.run.checkpoint import load_pretrained
from ddp_utils.run.epochs import end_epoch, finish_training
from ddp_utils.run.interrupt import own_ctrl_c
from ddp_utils.run.records import Records, open_records
from ddp_utils.run.report import first_batches_plotter
from ddp_utils.run.resume import find_resume
from ddp_utils.run.saves import SAVE_FAILED_EXIT_CODE, SaveFailed
from ddp_utils.run.start import Run, make_run_dir, record_run, start_run
from ddp_utils.run.training import Training, build_training
from ddp_utils.yolo.finetune import check_img_size, freeze_indices, freeze_layers, grid_size, transfer_weights


def parse_opt(argv: list[str] | bool | None = None, known: bool = False) -> argparse.Namespace:
    """The options from ``argv`` (default: the command line); ``known=True`` (or YOLOv5's ``parse_opt(True)``):
    the options train.py knows, the rest ignored."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_train_options(parser)  # YOLOv5's options, then ours: ddp_utils/run/options.py
    if isinstance(argv, bool):  # YOLOv5's parse_opt(True)
        argv, known = None, known or argv
    return parser.parse_known_args(argv)[0] if known else parser.parse_args(argv)


def run(**kwargs) -> argparse.Namespace:
    """Train from Python, as YOLOv5's ``train.run(data="coco128.yaml", imgsz=320)``; returns the options.

    A name that is no option raises TypeError (YOLOv5 would ignore it), a value the command line refuses
    (``imgsz=-5``) :class:`ddp_utils.run.OptionError`, a ValueError naming the option; any other mistake in
    the inputs (a missing data yaml) the error naming the file, never SystemExit; a diverged run
    ``TrainingDiverged``, a final or stop save that did not reach the disk ``ddp_utils.run.saves.SaveFailed``.
    """
    opt = options.options_with(parse_opt(known=True), kwargs, du.dist_info().world_size)
    with options.raising_user_errors():  # what the command line says in one line and exit 2, raised here
        main(opt)
    return opt


def main(opt: argparse.Namespace) -> None:
    # ---- launch: the options checked, the device chosen, then the process group ----
    info = du.dist_info()
    du.set_logging(info.rank)
    set_progress_mode(opt.progress)
    with options.user_errors():  # bad combinations, a device that is not there: one line, before any rendezvous
        options.check_options(opt, info.world_size)
        device = du.select_device(opt.device, batch_size=opt.batch_size if opt.batch_size > 0 else None)
    if opt.dist_debug:  # before the group forms: torch wraps it to check every collective across ranks
        du.distributed.enable_debug(Path(opt.project) / "dist_debug")
    du.init_distributed(device=device)
    finished = False
    try:
        if opt.evolve:  # YOLOv5's --evolve: trials from a study store, each one train_run (ddp_utils/evolve)
            from ddp_utils.evolve import evolve  # Optuna's, installed with ddp_utils[evolve]

            evolve(opt, info, device, train_run)
        else:
            train_run(opt, info, device)
        finished = True
    except engine.TrainingDiverged as exc:  # every rank alike, after last.pt was saved: one line, no traceback
        options.exit_or_raise(exc, code=options.DIVERGED_EXIT_CODE)
    except SaveFailed as exc:  # the final or stop save is not on disk: the line says which one is, exit 74
        options.exit_or_raise(exc, code=SAVE_FAILED_EXIT_CODE)
    finally:
        du.cleanup(wait=finished)  # on an error, leave at once: the others fail fast, not hang


def train_run(opt: argparse.Namespace, info: du.DistInfo, device: torch.device, stopper=None) -> str | None:
    """One run, in the process group main formed: "signal" when a signal stopped it (saved), else None."""
    with options.user_errors():
        # ---- resume: every reason to refuse is checked before anything is written ----
        resume = find_resume(opt, info, defaults=vars(parse_opt([])))
        if resume is not None and resume.finished:  # nothing to do, nothing written
            return None
        # ---- data: the data yaml and hyperparameters (loaders follow the model: they need its stride) ----
        run = start_run(resume.opt if resume else opt, info, device, resume)
        du.init_seeds(du.rank_seed(run.opt.seed, info.rank), deterministic=run.opt.deterministic)
        engine.set_cudnn_tuning(run.opt.cudnn_benchmark, run.opt.deterministic, run.opt.cudnn_benchmark_limit)
        # ---- model ----
        run, model, gs = build_model(run, device, info)
        train_loader, val_loader, dataset = build_loaders(run, info, gs, device)
    if run.save_dir is None:  # the inputs are good: claim a run directory (a new run, or a copied last.pt resumed)
        run = run.replace(save_dir=make_run_dir(opt.project, opt.name, opt.exist_ok, info))
    if failed := record_run(run, info):  # a disk too full for opt.yaml: nothing trained, exit 74
        raise SaveFailed(failed)
    # ---- optimizer, EMA, loss, DDP ----
    fit = build_training(run, model, device, info, gs, (train_loader, val_loader, dataset.labels))
    if stopper is not None:  # an evolve trial: judged once its warm-up, as the training has it, ends
        stopper.warmup_epochs = fit.step.warmup.epochs
    shape = (run.batch_size // info.world_size, 3, run.imgsz, run.imgsz)  # --cudnn-benchmark warm: tune it now,
    engine.warm_up_convolutions(fit.step, shape, device, mode=run.opt.cudnn_benchmark)  # beside the workers' start
    # ---- epochs, then finish ----
    return train(run, fit, device, info, stopper)


def build_model(run: Run, device: torch.device, info: du.DistInfo) -> tuple[Run, torch.nn.Module, int]:
    """The model: pretrained tensors where name and shape match, frozen layers, the size on its stride."""
    opt = run.opt
    ckpt = run.resume.ckpt if run.resume else load_pretrained(opt.weights) if opt.weights else None
    model = yolo.Model(ckpt["model_cfg"] if ckpt else opt.cfg, ch=3, nc=run.nc).to(device)  # YOLOv5's files too
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


def build_loaders(run: Run, info: du.DistInfo, gs: int, device: torch.device) -> tuple:
    """Each process loads batch_size / world_size images per step; the labels are checked against nc."""
    opt, batch = run.opt, run.batch_size // info.world_size
    common = dict(single_cls=opt.single_cls, hyp=run.hyp, cache=opt.cache, rank=info.local_rank, workers=opt.workers)
    train_options = dict(rect=opt.rect, image_weights=opt.image_weights, quad=opt.quad, shuffle=True, seed=opt.seed)
    place, line = du.data.augment_choice(opt.augment_on, device, opt.quad, opt.cache)  # CUDA: the device
    du.LOGGER.info(f"train: {line}")
    if place == "device":  # its kernels made ready beside the run (compiled once per machine); uncompiled until then
        du.data.renderer_for(device).prepare(run.channels_last, mixup=du.data.hyp_value(run.hyp, "mixup") > 0)
    train_options["augment_on"] = place
    train_loader, dataset = du.create_dataloader(
        run.data["train"], run.imgsz, batch, gs, augment=True, prefix="train: ", **train_options, **common
    )
    val_loader, _ = du.create_val_dataloader(run.data["val"], run.imgsz, batch * 2, gs, prefix="val: ", **common)
    dataset.check_classes(run.nc, opt.data)  # a label class >= nc: one line naming the label file
    if note := options.batch_size_note(run.batch_size, len(dataset)):  # YOLOv5 trains it, its batches cut short
        du.LOGGER.warning(note)
    return train_loader, val_loader, dataset


def train(run: Run, fit: Training, device: torch.device, info: du.DistInfo, stopper=None) -> str | None:
    """The epochs: train, validate, then the epoch's end (step the schedule, stop early, log, save:
    ddp_utils/run/epochs.py); stop on a signal (save, requeue), when steps stay non-finite (save the last
    finite state, raise TrainingDiverged), or at the end.

    A signal (SIGTERM, the requeue signal, a first Ctrl-C) stops every rank after the same optimizer step, or
    cuts a validation short: last.pt records the batch, and --resume continues at the next one. Returns "signal"
    then, else None; ``stopper`` (an evolve trial's pruning) takes the place of --patience's.
    """
    records = open_records(run, fit, info, stopper)  # results.csv, trackers, early stop, saves, control, watchdog
    stats = None
    with records:  # an error: the trackers' runs FAILED; a rank that stalls: all end, named
        for epoch in range(fit.state.epoch, run.epochs):
            stats = train_epoch(run, fit, device, info, records)
            if records.control.epoch_end(fit.step):  # a signal in the epoch or its last step, or non-finite steps
                break
            try:
                validated = validate(run, fit, device, epoch, records)
            except yolo.ValidationInterrupted:  # a signal during validation: the trained epoch is saved, unvalidated
                records.control.stop_anywhere()
                break
            stats, stop = None, end_epoch(run, fit, records, epoch, stats, validated, info)
            if stop:
                break
        records.finish_writes(fit, stats)  # last.pt of where training stopped, on disk before the process ends

    # ---- finish: rank 0 strips the optimizer from best.pt and draws the curves ----
    return finish_training(run, fit, records, info)


def train_epoch(run: Run, fit: Training, device: torch.device, info: du.DistInfo, records: Records):
    """One epoch, or what a resumed one has left: the loader starts at the batch to continue at."""
    opt, state = run.opt, fit.state
    if opt.image_weights:  # YOLOv5's --image-weights: rare and badly detected classes drawn more often
        fit.train_loader.set_image_weights(epoch_image_weights(fit.labels, run.nc, state.last_val.get("maps")))
    fit.train_loader.set_epoch(state.epoch, start_batch=state.batch)
    batches = DevicePrefetcher(fit.train_loader, device, fit.step.channels_last)  # on CUDA: copies overlap
    batches = records.watchdog.track(batches, "train")  # a batch that never comes is a stall
    first = info.is_main and state.epoch == 0 and not opt.noplots
    plot = first_batches_plotter(run.save_dir, run.names, first, optional=records.optional)  # a full disk: a warning
    return engine.train_one_epoch(
        fit.step,
        batches,
        state.epoch,
        device,
        start=state.batch,
        loss=state.rank_loss(info.rank, info.world_size),
        epochs=run.epochs,
        control=records.control,  # after every step: go on, save (rank 0's clock, every rank agrees) or stop
        on_save=lambda now: records.saves.periodic(fit, now),
        progress=info.is_main,
        on_batch=plot,
    )


def validate(run: Run, fit: Training, device: torch.device, epoch: int, records: Records) -> tuple:
    """Validate the EMA weights on every rank's shard: (metrics, val_loss); --noval repeats the last ones.
    A stop signal on any rank cuts it short: every rank raises yolo.ValidationInterrupted."""
    final_epoch = epoch + 1 == run.epochs
    if run.opt.noval and not final_epoch:
        return fit.state.metrics()  # results.csv reports the last validation again, as YOLOv5's does
    fit.step.ema.sync()  # BatchNorm statistics drift apart per rank; evaluate rank 0's
    ema, loss, stop = fit.step.ema.ema, fit.step.compute_loss, records.control.stop_requested  # a signal cuts it
    shown = dict(verbose=False, progress=du.is_main_process(), watchdog=records.watchdog)
    val = records.watchdog.track(fit.val_loader, "val")
    shown["amp_dtype"] = engine.AMP_DTYPES[run.amp]  # the network as it trains (fp16, bf16, fp32); boxes in fp32
    metrics, val_loss = yolo.evaluate(ema, val, loss, device=device, stop=stop, **shown)
    if run.opt.verbose or final_epoch:  # YOLOv5 val's table: all, then one row per class
        du.LOGGER.info(yolo.class_table(metrics, run.names, per_class=True if run.opt.verbose else None))
    return metrics, val_loss


if __name__ == "__main__":
    own_ctrl_c("train.py")  # to the process's end: a first press saves and stops after the step; a second, exit 130
    with contextlib.suppress(BrokenPipeError):
        record(main)(parse_opt())  # torchrun's failure report shows an uncaught error's traceback
