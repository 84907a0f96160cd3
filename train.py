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
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import ddp_utils as du
from ddp_utils.data import check_dataset, create_dataloader, create_val_dataloader, load_hyp
from ddp_utils.detect import ComputeLoss, Model, evaluate, fitness
from ddp_utils.engine import (
    NBS,
    EarlyStopping,
    ModelEMA,
    PreemptionHandler,
    ResultsLogger,
    Warmup,
    accumulate_steps,
    build_checkpoint,
    de_parallel,
    increment_path,
    latest_checkpoint,
    load_checkpoint,
    lr_lambda,
    plot_images,
    plot_labels,
    plot_results,
    restore_training,
    results_values,
    save_checkpoint,
    scaled_weight_decay,
    should_stop_everywhere,
    smart_optimizer,
    strip_optimizer,
    yaml_save,
)


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--weights", default="", help="checkpoint to start from ('' trains from scratch)")
    add("--cfg", default="yolov5n.yaml", help="model yaml (configs/models/ or a path)")
    add("--data", default="shapes.yaml", help="dataset yaml (data/ or a path)")
    add("--hyp", default=None, help="hyperparameter yaml; default: the data yaml's, else hyp.scratch-low.yaml")
    add("--epochs", type=int, default=None, help="default: the data yaml's train_defaults, else 100")
    add("--batch-size", type=int, default=16, help="total batch size over all processes")
    add("--imgsz", "--img", "--img-size", type=int, default=None, help="train/val size (px); default from data yaml")
    add("--rect", action="store_true", help="rectangular training batches")
    add("--resume", nargs="?", const=True, default=False, help="resume the latest run, or the given last.pt")
    add("--nosave", action="store_true", help="only save the final checkpoint")
    add("--noval", action="store_true", help="only validate after the final epoch")
    add("--cache", nargs="?", const="ram", default=None, choices=["ram", "disk"], help="cache images")
    add("--image-weights", action="store_true", help="sample images by class weights (single process)")
    add("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    add("--multi-scale", action="store_true", help="vary image size +/- 50%%")
    add("--single-cls", action="store_true", help="train multi-class data as single-class")
    add("--optimizer", default="SGD", choices=["SGD", "Adam", "AdamW"])
    add("--sync-bn", action="store_true", help="SyncBatchNorm across processes (DDP only)")
    add("--workers", type=int, default=8, help="max data-loader workers per process")
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
    # torch.distributed.launch passes --local_rank; the rank always comes from the environment
    add("--local_rank", "--local-rank", type=int, default=-1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check_opt(opt: argparse.Namespace, info: du.DistInfo) -> None:
    """Refuse bad combinations before any process group starts."""
    if opt.batch_size < 1:
        raise SystemExit(f"--batch-size {opt.batch_size}: give the total batch size, a positive integer")
    if opt.batch_size % info.world_size:
        raise SystemExit(
            f"--batch-size {opt.batch_size} does not divide by WORLD_SIZE={info.world_size}: "
            f"use a multiple of {info.world_size}"
        )
    if opt.image_weights and info.world_size > 1:
        raise SystemExit("--image-weights works in a single process only: drop it or run without torchrun")
    if opt.epochs is not None and opt.epochs < 1:
        raise SystemExit(f"--epochs {opt.epochs}: train at least one epoch")
    if opt.sync_bn and info.world_size == 1:
        du.LOGGER.warning("--sync-bn has no effect in a single process")
    if opt.rect and opt.multi_scale:
        raise SystemExit("--rect and --multi-scale do not go together: rect batches have fixed shapes")


def resolve_run(opt: argparse.Namespace, info: du.DistInfo) -> tuple[argparse.Namespace, dict | None]:
    """Pick the run directory and, when resuming, the checkpoint to continue from.

    An elastic restart (torchrun --max-restarts) resumes the same run by itself.
    """
    run_key = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{info.master_addr}:{info.master_port}"
    last = None
    if opt.resume:
        last = Path(opt.resume) if isinstance(opt.resume, str) else latest_checkpoint(opt.project)
        if last is None:
            raise SystemExit(f"--resume: no {opt.project}/*/weights/last.pt to resume; give the path")
    elif info.restart_count > 0:
        last = latest_checkpoint(opt.project, run_key=run_key)
        if last is None:
            du.LOGGER.warning(f"elastic restart {info.restart_count}: no last.pt of this run yet, starting over")
    if last is not None:
        ckpt = load_checkpoint(last)
        resumed = argparse.Namespace(**ckpt["opt"])
        resumed.resume, resumed.weights, resumed.run_key = str(last), str(last), run_key
        resumed.save_dir = str(Path(last).parent.parent)
        du.LOGGER.info(f"resuming {resumed.save_dir} from epoch {ckpt['epoch'] + 1}")
        return resumed, ckpt
    opt.run_key = run_key
    save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True) if info.is_main else None
    opt.save_dir = str(du.broadcast_object(save_dir))
    return opt, None


def main(opt: argparse.Namespace) -> None:
    info = du.dist_info()
    du.set_logging(info.rank)
    check_opt(opt, info)
    du.init_distributed()
    try:
        device = du.select_device(opt.device, batch_size=opt.batch_size)
        opt, ckpt = resolve_run(opt, info)
        train(opt, device, info, ckpt)
    finally:
        du.cleanup()


def train(opt: argparse.Namespace, device: torch.device, info: du.DistInfo, ckpt: dict | None) -> dict:
    save_dir = Path(opt.save_dir)
    weights_dir = save_dir / "weights"
    last, best = weights_dir / "last.pt", weights_dir / "best.pt"
    cuda = device.type == "cuda"
    main_process = info.is_main

    # ---- data and hyperparameters (the node's first process downloads or generates the data) ----
    data = check_dataset(opt.data)
    defaults = data.get("train_defaults", {})
    opt.epochs = opt.epochs or defaults.get("epochs", 100)
    opt.imgsz = opt.imgsz or defaults.get("imgsz", 640)
    opt.hyp = opt.hyp or defaults.get("hyp", "hyp.scratch-low.yaml")
    hyp = load_hyp(opt.hyp) if isinstance(opt.hyp, str) else dict(opt.hyp)
    nc = 1 if opt.single_cls else int(data["nc"])
    names = {0: "item"} if opt.single_cls and len(data["names"]) != 1 else data["names"]
    if main_process:
        weights_dir.mkdir(parents=True, exist_ok=True)
        yaml_save(save_dir / "hyp.yaml", hyp)
        yaml_save(save_dir / "opt.yaml", vars(opt))
        du.LOGGER.info("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hyp.items()))
    du.init_seeds(du.rank_seed(opt.seed, info.rank), deterministic=opt.deterministic)

    # ---- model ----
    if ckpt is None and opt.weights:
        ckpt = load_checkpoint(opt.weights)
    model = Model(ckpt["model_cfg"] if ckpt else opt.cfg, ch=3, nc=nc).to(device)
    if ckpt is not None and not opt.resume:
        # pretrained weights (the EMA's): every tensor whose name and shape match, so nc may change
        own = model.state_dict()
        matched = {k: v for k, v in ckpt["model"].items() if k in own and v.shape == own[k].shape}
        model.load_state_dict(matched, strict=False)
        du.LOGGER.info(f"transferred {len(matched)}/{len(own)} tensors from {opt.weights}")
    freeze = [f"model.{x}." for x in (opt.freeze if len(opt.freeze) > 1 else range(opt.freeze[0]))]
    for name, param in model.named_parameters():
        param.requires_grad = not any(name.startswith(f) for f in freeze)
    grid_size = max(int(model.stride.max()), 32)
    imgsz = math.ceil(opt.imgsz / grid_size) * grid_size
    if imgsz != opt.imgsz:
        du.LOGGER.warning(f"--imgsz {opt.imgsz} is not a multiple of the stride {grid_size}: using {imgsz}")

    # ---- optimiser: gradients accumulate up to the nominal batch size, decay scales with it ----
    nbs = int(hyp.get("nbs", NBS))
    accumulate = accumulate_steps(opt.batch_size, nbs)
    hyp["weight_decay"] = scaled_weight_decay(hyp["weight_decay"], opt.batch_size, accumulate, nbs)
    optimizer = smart_optimizer(model, opt.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    lf = lr_lambda(hyp["lrf"], opt.epochs, cos_lr=opt.cos_lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    ema = ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    start_epoch, best_fitness = 0, 0.0
    if ckpt is not None and opt.resume:
        start_epoch, best_fitness = restore_training(ckpt, model, optimizer, ema, scaler)
        if start_epoch >= opt.epochs:
            du.LOGGER.info(f"{opt.resume} has finished all {opt.epochs} epochs: nothing to resume")
            return {}
    scheduler.last_epoch = start_epoch - 1

    # ---- DDP: SyncBatchNorm on request, then wrap; DDP broadcasts rank 0's weights ----
    if info.distributed:
        if opt.sync_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
            du.LOGGER.info("using SyncBatchNorm")
        model = DDP(model, device_ids=[device.index] if cuda else None)

    # ---- loaders: each process loads batch_size / world_size images per step ----
    batch_per_rank = opt.batch_size // info.world_size
    train_loader, dataset = create_dataloader(
        data["train"],
        imgsz,
        batch_per_rank,
        grid_size,
        single_cls=opt.single_cls,
        hyp=hyp,
        augment=True,
        cache=opt.cache,
        rect=opt.rect,
        rank=info.local_rank,
        workers=opt.workers,
        image_weights=opt.image_weights,
        quad=opt.quad,
        prefix="train: ",
        shuffle=True,
        seed=opt.seed,
    )
    val_loader, _ = create_val_dataloader(
        data["val"],
        imgsz,
        batch_per_rank * 2,
        grid_size,
        single_cls=opt.single_cls,
        hyp=hyp,
        cache=opt.cache,
        rank=info.local_rank,
        workers=opt.workers,
        prefix="val: ",
    )
    max_label_class = max((int(lb[:, 0].max()) for lb in dataset.labels if len(lb)), default=0)
    if max_label_class >= nc:
        raise SystemExit(f"{opt.data}: a label has class {max_label_class}, but nc={nc}")

    # ---- loss gains scale with the number of levels, classes and the image size ----
    nl = de_parallel(model).model[-1].nl
    hyp["box"] *= 3 / nl
    hyp["cls"] *= nc / 80 * 3 / nl
    hyp["obj"] *= (imgsz / 640) ** 2 * 3 / nl
    hyp["label_smoothing"] = opt.label_smoothing
    if ckpt is None:
        labels = np.concatenate([lb for lb in dataset.labels if len(lb)] or [np.zeros((0, 5))])
        class_frequency = torch.from_numpy(np.bincount(labels[:, 0].astype(int), minlength=nc)).float()
        de_parallel(model).initialize_biases(class_frequency)
        ema = ModelEMA(de_parallel(model))  # the EMA starts from the initialised biases
    compute_loss = ComputeLoss(model, hyp)

    # ---- logging, rank 0 only ----
    logger = ResultsLogger(save_dir, start_epoch=start_epoch)  # writes on rank 0 only
    if start_epoch == 0:
        plot_labels(dataset.labels, names, save_dir)
    stopper = EarlyStopping(patience=opt.patience)
    if start_epoch:
        stopper.best_fitness, stopper.best_epoch = best_fitness, start_epoch - 1
    nb = len(train_loader)
    warmup = Warmup(
        optimizer,
        lf,
        nb,
        hyp["warmup_epochs"],
        hyp["warmup_bias_lr"],
        hyp["warmup_momentum"],
        hyp["momentum"],
        min_iters=int(hyp.get("warmup_min_iters", 100)),
    )
    du.LOGGER.info(
        f"image size {imgsz}, {info.world_size} process(es) x {batch_per_rank} images, accumulate {accumulate}, "
        f"{len(dataset)} training images, {opt.epochs} epochs, logging to {save_dir}"
    )

    # ---- the training loop ----
    metrics, val_loss = {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.0}, torch.zeros(3)
    last_opt_step = -1
    preemption = PreemptionHandler()
    epoch = start_epoch
    with preemption:
        for epoch in range(start_epoch, opt.epochs):
            model.train()
            train_loader.set_epoch(epoch)
            mloss = torch.zeros(3, device=device)
            data_time = compute_time = 0.0
            pbar = enumerate(train_loader)
            if main_process:
                pbar = tqdm(pbar, total=nb, bar_format="{l_bar}{bar:10}{r_bar}", file=sys.stderr)
            optimizer.zero_grad()
            t_data = time.perf_counter()
            for i, (imgs_uint8, targets, paths, _shapes) in pbar:
                ni = i + nb * epoch  # integrated batches since the start of training
                imgs = imgs_uint8.to(device, non_blocking=True).float() / 255
                t_compute = time.perf_counter()
                data_time += t_compute - t_data
                warmup.step(ni, epoch)
                accumulate = warmup.accumulate(ni, accumulate_steps(opt.batch_size, nbs))

                if opt.multi_scale:
                    size = random.randrange(int(imgsz * 0.5), int(imgsz * 1.5) + grid_size) // grid_size * grid_size
                    factor = size / max(imgs.shape[2:])
                    if factor != 1:
                        new_shape = [math.ceil(x * factor / grid_size) * grid_size for x in imgs.shape[2:]]
                        imgs = torch.nn.functional.interpolate(imgs, size=new_shape, mode="bilinear")

                with torch.autocast(device.type, enabled=cuda):
                    pred = model(imgs)
                    loss, loss_items = compute_loss(pred, targets.to(device))
                    if info.distributed:
                        loss *= info.world_size  # DDP averages gradients; the loss is a per-image sum
                scaler.scale(loss).backward()

                if ni - last_opt_step >= accumulate:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
                    ema.update(model)
                    last_opt_step = ni

                mloss = (mloss * i + loss_items) / (i + 1)
                compute_time += du.time_synchronized(device) - t_compute
                if main_process:
                    memory = f"{torch.cuda.memory_reserved(device) / 2**30:.2f}G" if cuda else "-"
                    pbar.set_description(
                        f"{epoch + 1}/{opt.epochs} mem {memory} box {mloss[0]:.4f} obj {mloss[1]:.4f} "
                        f"cls {mloss[2]:.4f} inst {targets.shape[0]} size {imgs.shape[-1]}"
                    )
                    if epoch == start_epoch and i < 3:
                        plot_images(imgs_uint8, targets, save_dir / f"train_batch{i}.jpg", paths, names)
                if preemption.requested_anywhere():
                    break
                t_data = time.perf_counter()

            lrs = [group["lr"] for group in optimizer.param_groups]
            scheduler.step()
            train_loss = du.reduce_tensor(mloss, op="mean").cpu()
            if preemption.requested_anywhere():
                # the epoch is incomplete: save the previous one's state so resume redoes this epoch
                save_run(last, model, ema, optimizer, scaler, epoch - 1, best_fitness, opt, hyp)
                du.LOGGER.warning(f"SIGTERM: saved {last} at epoch {epoch}; resume with --resume {last}")
                break

            # ---- validate on every rank's shard with the EMA weights; rank 0 computes mAP ----
            final_epoch = epoch + 1 == opt.epochs
            if not opt.noval or final_epoch:
                ema.sync()  # BatchNorm statistics drift apart per rank; evaluate rank 0's
                metrics, val_loss = evaluate(ema.ema, val_loader, compute_loss=compute_loss, device=device)
            fit = fitness(metrics)
            stop = should_stop_everywhere(stopper(epoch, fit))
            best_fitness = max(best_fitness, fit)
            logger.log(epoch, results_values(train_loss, metrics, val_loss, lrs))
            if main_process:
                du.LOGGER.info(
                    f"epoch {epoch + 1}: P {metrics['precision']:.3f} R {metrics['recall']:.3f} "
                    f"mAP@0.5 {metrics['map50']:.3f} mAP@0.5:0.95 {metrics['map']:.3f} "
                    f"(data {data_time:.1f}s, compute {compute_time:.1f}s)"
                )
            if not opt.nosave or final_epoch or stop:
                save_run(last, model, ema, optimizer, scaler, epoch, best_fitness, opt, hyp)
                if best_fitness == fit:
                    save_run(best, model, ema, optimizer, scaler, epoch, best_fitness, opt, hyp)
                if opt.save_period > 0 and (epoch + 1) % opt.save_period == 0:
                    save_run(
                        weights_dir / f"epoch{epoch}.pt", model, ema, optimizer, scaler, epoch, best_fitness, opt, hyp
                    )
            if stop:
                break

    # ---- finish: rank 0 strips the optimizer from best.pt and draws the curves ----
    logger.close()
    if main_process and not preemption.requested():
        if best.exists():
            strip_optimizer(best)
        plot_results(save_dir / "results.csv")
        du.LOGGER.info(
            f"{epoch - start_epoch + 1} epochs done; results in {save_dir}; "
            f"final mAP@0.5 {metrics['map50']:.3f}, mAP@0.5:0.95 {metrics['map']:.3f}"
        )
    return metrics


def save_run(path, model, ema, optimizer, scaler, epoch, best_fitness, opt, hyp) -> None:
    """Rank 0 writes the checkpoint atomically (EMA weights, plus the raw ones to resume exactly)."""
    if not du.is_main_process():
        return
    ckpt = build_checkpoint(
        ema.ema,
        optimizer=optimizer,
        scaler=scaler if scaler.is_enabled() else None,
        ema_updates=ema.updates,
        epoch=epoch,
        best_fitness=best_fitness,
        opt=vars(opt),
        hyp=hyp,
    )
    ckpt["train_model"] = de_parallel(model).state_dict()
    save_checkpoint(ckpt, path)


if __name__ == "__main__":
    main(parse_opt())
