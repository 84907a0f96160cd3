"""Unwrap models that DistributedDataParallel, DataParallel or torch.compile hold (one home: ``ddp_utils.dist``)."""

from __future__ import annotations

from ..dist.parallel import de_parallel, is_parallel, unwrap_model

__all__ = ["de_parallel", "is_parallel", "unwrap_model"]
