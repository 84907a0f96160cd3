#!/bin/bash
# Train on Kubernetes with TorchX's dist.ddp component: 2 nodes x 8 GPUs, torchrun on each, c10d
# rendezvous; train.py runs unchanged. TorchX's Kubernetes scheduler needs Volcano (gang scheduling)
# and mounts a memory-backed /dev/shm in every pod by itself, so --cache ram keeps one copy of the
# decoded images per pod there (without it, the cache would fall back to a memory-mapped file on
# the pod's local disk; see pytorchjob.yaml).
#
#   pip install "torchx[kubernetes]"
#   bash examples/kubernetes/torchx.sh
#
# Elastic between 2 and 4 nodes: -j 2:4x8. --max_retries restarts the job's workers on a failure,
# and each restart resumes this run from last.pt by itself; runs/ must be on a mounted volume.

set -euo pipefail

IMAGE=${IMAGE:-ghcr.io/example/ddp-utils:latest}
QUEUE=${QUEUE:-default}

torchx run -s kubernetes -cfg "queue=${QUEUE},namespace=default" \
    dist.ddp \
        -j 2x8 \
        --gpu 8 \
        --cpu 64 \
        --memMB 524288 \
        --image "${IMAGE}" \
        --max_retries 3 \
        --mounts type=volume,src=runs,dst=/runs,type=volume,src=datasets,dst=/datasets \
        --env DDP_UTILS_DATASETS_DIR=/datasets \
        --script train.py \
        -- \
        --data coco.yaml \
        --cfg yolov5s.yaml \
        --epochs 300 \
        --batch-size 256 \
        --cache ram \
        --project /runs/train \
        --name coco
