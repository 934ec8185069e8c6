"""ElasticSampler: partitions a dataset over the ranks and re-partitions what is left after a reset."""

import math
import random

import torch.utils.data

from hvdcompat.basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Sampler that shards a dataset over the ranks and survives world-size changes.

    Like ``DistributedSampler``, but it counts the samples processed this
    epoch (:meth:`record_batch`), and when its state is restored or synced
    after a reset it deals only the samples not yet processed over the new
    set of ranks. Within an epoch no sample is processed twice or skipped
    across resets, provided every rank records the same number of batches
    between commits (synchronous training does).

    Every epoch the same shuffled order is computed on every rank (seeded by
    ``seed + epoch``); ``processed_num`` counts how many of its leading
    samples have been processed, and rank ``r`` of ``n`` takes every n-th of
    the rest, starting at ``r``. When what is left does not divide by ``n``,
    the first samples are repeated at the end so that every rank runs the
    same number of batches (as ``DistributedSampler`` does); those repeats are
    the only samples that run twice, and recording them never counts past the
    end of the epoch.

    Use it like this: put it in the :class:`TorchState`, call
    :meth:`record_batch` after each batch, and :meth:`set_epoch` at the *end*
    of each epoch (it clears the processed count).

    Args:
        dataset: the dataset (its length must not change).
        shuffle: shuffle the order every epoch (default True).
        seed: shuffle seed; must be the same on every rank (default 0).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: a new order, nothing processed yet.

        Call it at the end of an epoch, not at its start, so that a reset in
        the middle of an epoch does not forget what was processed.

        Args:
            epoch: the epoch number.
        """
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every rank processed one more batch of `batch_size` samples.

        Args:
            batch_idx: index of the batch in this epoch (unused; Horovod's signature).
            batch_size: samples per batch on each rank.
        """
        self.processed_num = min(self.processed_num + batch_size * self.num_replicas,
                                 len(self.dataset))

    def state_dict(self):
        """``{'epoch': ..., 'processed_num': ...}``: enough to resume on any world size."""
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        """Resumes from :meth:`state_dict` and re-partitions over the current ranks."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def order(self):
        """This epoch's order of all dataset indices (identical on every rank)."""
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        return indices

    def reset(self):
        """Re-partitions the unprocessed samples over the current ranks (after init or a reset)."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = self.order()[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        while indices and len(indices) < self.total_size:
            indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
