"""Frozen, validated descriptions of the model, hardware, job and parallel strategy."""

from simpar.specs.cluster import ClusterSpec, builtin_clusters, dgx_like, load_cluster
from simpar.specs.gpu import GPUS, GPUSpec
from simpar.specs.job import JobSpec
from simpar.specs.loaders import load_model
from simpar.specs.model import ModelSpec
from simpar.specs.model_catalog import MODELS
from simpar.specs.strategy import Strategy, split_layers, validate

__all__ = [
    "ClusterSpec", "builtin_clusters", "GPUS", "GPUSpec", "JobSpec", "MODELS", "ModelSpec",
    "Strategy", "dgx_like", "load_cluster", "load_model", "split_layers", "validate"
]
