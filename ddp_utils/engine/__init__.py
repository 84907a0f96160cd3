"""What a training loop needs beyond the data and the model.

``train_one_epoch`` (the step, accumulation, AMP, timing), EMA weights, atomic checkpoints
(``Checkpointer`` owns a run's last/best/epochN), early stopping, the optimizer with its schedule and
warm-up, the run directory and its results (csv, plots, TensorBoard), and a SIGTERM flag
so a preempted run saves and stops cleanly. Writers act on the main process only and
return at once elsewhere, so every call below can run on every rank, except
``increment_path`` (rank 0, then broadcast the directory).

How a training script uses it (names as in YOLOv5's train.py)::

    save_dir = broadcast_object(increment_path("runs/train/exp", mkdir=True) if is_main_process() else None)
    accumulate = accumulate_steps(total_batch_size)
    hyp["weight_decay"] = scaled_weight_decay(hyp["weight_decay"], total_batch_size, accumulate)
    optimizer = smart_optimizer(model, opt.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    lf = lr_lambda(hyp["lrf"], epochs, cos_lr=opt.cos_lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    ema = ModelEMA(model)                                   # every rank: evaluate() runs on all of them
    start_epoch, best_fitness = 0, 0.0
    if resuming:
        start_epoch, best_fitness = restore_training(load_checkpoint(last), model, optimizer, ema, scaler)
    model = DDP(model, device_ids=[local_rank])             # after restoring, before training
    warmup = Warmup(optimizer, lf, nb, hyp["warmup_epochs"], hyp["warmup_bias_lr"],
                    hyp["warmup_momentum"], hyp["momentum"])
    results = ResultsLogger(save_dir, start_epoch)
    stopper = EarlyStopping(opt.patience)
    with PreemptionHandler() as preempt:
        for epoch in range(start_epoch, epochs):
            for i, (imgs, targets, paths, _) in enumerate(loader):
                ni = i + nb * epoch
                warmup.step(ni, epoch)
                ...forward, backward; every warmup.accumulate(ni, accumulate) batches: step, ema.update(model)
                if preempt.requested_anywhere():               # all ranks leave at the same step
                    break
            scheduler.step()
            ema.sync()                                         # BatchNorm stats: every rank gets rank 0's
            metrics, val_loss = evaluate(ema.ema, ...)
            results.log(epoch, results_values(mloss, metrics, val_loss, [g["lr"] for g in optimizer.param_groups]))
            ckpt = build_checkpoint(ema.ema, optimizer=optimizer, scaler=scaler, ema_updates=ema.updates,
                                    epoch=epoch, best_fitness=best_fitness, opt=opt, hyp=hyp)
            save_checkpoint(ckpt, save_dir / "weights" / "last.pt")   # rank 0 writes, atomically
            if should_stop_everywhere(stopper(epoch, fitness(metrics))) or preempt.requested_anywhere():
                break
    strip_optimizer(save_dir / "weights" / "best.pt")
    plot_results(save_dir / "results.csv")
"""

from .checkpoint import (
    CHECKPOINT_KEYS,
    Checkpointer,
    CheckpointError,
    CheckpointWriteError,
    UnsafeCheckpointError,
    atomic_torch_save,
    atomic_write_bytes,
    build_checkpoint,
    check_plain,
    latest_checkpoint,
    load_checkpoint,
    restore_training,
    save_checkpoint,
    strip_optimizer,
    to_plain,
)
from .early_stop import EarlyStopping, should_stop_everywhere
from .ema import ModelEMA
from .loggers import RESULTS_COLUMNS, ResultsLogger, increment_path, results_values, tensorboard_writer, yaml_save
from .modules import de_parallel, is_parallel
from .optim import (
    NBS,
    OPTIMIZERS,
    Warmup,
    accumulate_steps,
    cosine_lr,
    linear_lr,
    lr_lambda,
    one_cycle,
    param_groups,
    scaled_weight_decay,
    smart_optimizer,
)
from .plots import class_color, plot_images, plot_labels, plot_results
from .signals import PreemptionHandler
from .trainer import (
    AMP_DTYPES,
    EpochStats,
    TrainStep,
    class_frequency,
    init_class_biases,
    multi_scale_resize,
    resolve_amp,
    train_one_epoch,
)

__all__ = [
    "train_one_epoch",
    "resolve_amp",
    "multi_scale_resize",
    "init_class_biases",
    "class_frequency",
    "TrainStep",
    "EpochStats",
    "AMP_DTYPES",
    "CHECKPOINT_KEYS",
    "NBS",
    "OPTIMIZERS",
    "RESULTS_COLUMNS",
    "CheckpointError",
    "Checkpointer",
    "CheckpointWriteError",
    "EarlyStopping",
    "ModelEMA",
    "PreemptionHandler",
    "ResultsLogger",
    "UnsafeCheckpointError",
    "Warmup",
    "accumulate_steps",
    "atomic_torch_save",
    "atomic_write_bytes",
    "build_checkpoint",
    "check_plain",
    "class_color",
    "cosine_lr",
    "de_parallel",
    "increment_path",
    "is_parallel",
    "latest_checkpoint",
    "linear_lr",
    "load_checkpoint",
    "lr_lambda",
    "one_cycle",
    "param_groups",
    "plot_images",
    "plot_labels",
    "plot_results",
    "restore_training",
    "results_values",
    "save_checkpoint",
    "scaled_weight_decay",
    "should_stop_everywhere",
    "smart_optimizer",
    "strip_optimizer",
    "tensorboard_writer",
    "to_plain",
    "yaml_save",
]
