"""ClusterSpec: the GPU type, the node (GPUs, NVLink, NICs) and, optionally, the fabric topology.

The flat fields describe a node and its NICs; they are all the alpha-beta network model
needs. The `topology` (a TopologySpec) describes the fabric between nodes, which the flow
model builds as a graph. Built-in clusters are the files in the `topologies` folder."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path

from simpar.errors import (
    SpecError,
    is_number,
    nearest,
    positive_float,
    positive_int,
    reject_unknown,
    require,
    require_numbers,
)
from simpar.specs.gpu import GIB_PER_GB, GPU_ALIASES, GPU_AMBIGUOUS, GPUS, GPUSpec
from simpar.specs.names import canonical, normal_form
from simpar.specs.topology import TopologySpec, topology_from_dict

# Achievable fraction of link bandwidth for large collectives (nccl-tests bus
# bandwidth): NVLink/NVSwitch all-reduce reaches ~230-240 of 300 GB/s on DGX A100 and
# 367.6 of 450 GB/s on H100/H200 with NVLS off (shared/calibration: allreduce_8xH200);
# InfiniBand reaches ~90% of line rate.
DEFAULT_INTRA_NODE_EFFICIENCY = 0.8
DEFAULT_INTER_NODE_EFFICIENCY = 0.9
# NCCL's network post overhead on Intel x86 and Arm hosts, and on AMD x86 ones (getNetOverhead)
NET_POST_US, AMD_HOST_NET_POST_US = 1.0, 2.0
# GPUs in one node (one NVLink domain) at most: NVIDIA's largest announced domain is 576
MAX_GPUS_PER_NODE = 1024
EFFICIENCY_OPS = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast")


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpu: GPUSpec
    gpus_per_node: int
    intra_node_bw_gbps: float  # per GPU, per direction (NVLink: A100 300, H100 450)
    intra_node_latency_us: float  # per collective step inside a node
    nic_bw_gbps: float  # per GPU, per direction, between nodes (200 Gb/s HDR = 25 GB/s)
    inter_node_latency_us: float  # per collective step across nodes
    intra_node_efficiency: float = DEFAULT_INTRA_NODE_EFFICIENCY
    inter_node_efficiency: float = DEFAULT_INTER_NODE_EFFICIENCY
    topology: TopologySpec | None = None  # None: the flat two-level network only
    # GPU <-> host per GPU per direction: PCIe Gen4 x16 achieves ~25 of 32 GB/s
    host_link_gbps: float = 25.0
    # NCCL's network post overhead per message on a node's proxy thread (getNetOverhead in
    # src/graph/tuning.cc: 1 us on Intel x86 hosts, 2 on AMD x86, 1 otherwise); a ring that
    # crosses nodes paces every step at NCCL_SIMPLE_NET_POSTS of them (network/collectives.py)
    net_post_us: float = NET_POST_US
    # host memory bandwidth per GPU, for an optimizer step run on the host (ZeRO-Offload: Ren
    # et al. 2021): a DGX host's ~400 GB/s of DRAM over its 8 GPUs
    host_memory_gbps: float = 50.0
    # data-parallel replicas' step times vary: each takes (1 + X) of the step, X exponential with
    # this mean (the shifted-exponential straggler model of Lee et al. 2017); 0: identical replicas
    straggler_delay_frac: float = 0.0
    # measured speed of a collective kind against the ring model the link figures give,
    # ((op, factor), ...): `simpar calibrate` writes it for gloo, whose gathers and
    # scatters run well below its all-reduce; kinds not named run at the ring model
    # (NCCL's do, nccl-tests bus bandwidths on one fabric agree)
    collective_efficiency: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        require(isinstance(self.name, str) and self.name != "", "cluster.name", self.name,
                "give the cluster a name")
        require_numbers(self, "cluster")
        positive_int("cluster.gpus_per_node", self.gpus_per_node)
        # the fabric graph is built node by node: a typo of 10^9 would fill memory
        require(self.gpus_per_node <= MAX_GPUS_PER_NODE, "cluster.gpus_per_node",
                self.gpus_per_node, f"is beyond {MAX_GPUS_PER_NODE} (the largest NVLink domains "
                "hold 576 GPUs); check the cluster file")
        for f in ("intra_node_bw_gbps", "nic_bw_gbps", "host_link_gbps", "host_memory_gbps"):
            positive_float(f"cluster.{f}", getattr(self, f))
        for f in ("intra_node_latency_us", "inter_node_latency_us", "net_post_us"):
            require(getattr(self, f) >= 0, f"cluster.{f}", getattr(self, f),
                    "must be a number >= 0 (microseconds)")
        require(self.straggler_delay_frac >= 0, "cluster.straggler_delay_frac",
                self.straggler_delay_frac, "is a mean extra share of the step: give a value >= 0")
        for op, v in self.collective_efficiency:
            require(op in EFFICIENCY_OPS, "cluster.collective_efficiency", op,
                    f"name one of {', '.join(EFFICIENCY_OPS)}")
            require(is_number(v) and 0 < v <= 1, f"cluster.collective_efficiency.{op}", v,
                    "is a fraction of the ring model's speed: give a value in (0, 1]")
        for f in ("intra_node_efficiency", "inter_node_efficiency"):
            v = getattr(self, f)
            require(0 < v <= 1, f"cluster.{f}", v,
                    "is a fraction of link bandwidth: give a value in (0, 1]")

    def efficiency_of(self, op: str) -> float:
        """The measured speed of collective kind `op` against the ring model (1 where
        not measured)."""
        # on every collective: no dict
        return next((v for kind, v in self.collective_efficiency if kind == op), 1.0)

    @property
    def intra_bw_bytes_per_s(self) -> float:
        return self.intra_node_bw_gbps * 1e9 * self.intra_node_efficiency

    @property
    def inter_bw_bytes_per_s(self) -> float:
        return self.nic_bw_gbps * 1e9 * self.inter_node_efficiency

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["gpu"] = self.gpu.to_dict()
        d["collective_efficiency"] = dict(self.collective_efficiency)
        if self.topology is not None:
            d["topology"] = {
                "kind": self.topology.kind,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in self.topology.params},
            }
        return d

    @classmethod
    def from_dict(cls, data: dict, source: str = "cluster") -> ClusterSpec:
        known = {f.name for f in fields(cls)}
        reject_unknown(source, data, known)
        data = dict(data)
        gpu = data.get("gpu")
        if isinstance(gpu, str):
            data["gpu"] = resolve_gpu(gpu)
        elif isinstance(gpu, dict):
            data["gpu"] = GPUSpec.from_dict(gpu, source=f"{source}.gpu")
        else:
            raise SpecError(f"{source}.gpu", gpu,
                            "give a GPU catalog name or a mapping of GPU fields")
        if "topology" in data:
            data["topology"] = topology_from_dict(data["topology"], f"{source}.topology")
        eff = data.get("collective_efficiency", {})
        if not isinstance(eff, dict):
            raise SpecError(f"{source}.collective_efficiency", eff,
                            "give a mapping of collective kind to fraction")
        # sorted as text: a YAML key may be a number (refused by name in __post_init__)
        data["collective_efficiency"] = tuple(sorted(eff.items(), key=lambda kv: str(kv[0])))
        missing = [f.name for f in fields(cls) if f.name not in data and f.default is MISSING]
        if missing:
            raise SpecError(f"{source}.{missing[0]}", None, "is required")
        return cls(**data)


# Words around a GPU's name in vendors' product and system names that tell no catalog GPU from
# another: the vendor's, a DGX or HGX system's (eight of the GPU), a rack's (a GB200 NVL72 is
# gb200s; not the H100 NVL, a card of its own), the memory's kind.
GPU_NAME_NOISE = frozenset(("nvidia", "amd", "instinct", "tesla", "dgx", "hgx", "nvl72", "nvl36",
                            "superchip", "hbm3", "hbm3e", "hbm2e", "gpu"))


def gpu_name(name: str) -> str:
    """The catalog GPU a user's name for it means (names.canonical: "H100-SXM" is h100-sxm; then
    without GPU_NAME_NOISE: "DGX-B200", "GB200 NVL72"; then without a memory size the one GPU it
    names holds within 10%: "B200-180GB"), or the name as typed."""
    meant = canonical(name, GPUS, GPU_ALIASES)
    if meant in GPUS or not isinstance(name, str):
        return meant
    words = [w + "b" if w[:-1].isdigit() and w.endswith("g") else w  # 80G: 80GB
             for w in normal_form(name).split("-") if w not in GPU_NAME_NOISE]
    meant = canonical("-".join(words), GPUS, GPU_ALIASES)
    if meant in GPUS or normal_form(meant) in GPU_AMBIGUOUS:
        return meant
    sizes = [float(w[:-2]) for w in words if w[:-2].isdigit() and w.endswith("gb")]
    bare = canonical("-".join(w for w in words if not w.endswith("gb")), GPUS, GPU_ALIASES)
    holds = bare in GPUS and len(sizes) == 1 and abs(
        GPUS[bare].hbm_gib / (sizes[0] * GIB_PER_GB) - 1) <= 0.1
    return bare if holds else name


def resolve_gpu(name: str) -> GPUSpec:
    name = gpu_name(name)
    meant = GPU_AMBIGUOUS.get(normal_form(name), ())
    require(not meant, "gpu", name, f"names {' or '.join(meant)} by its memory: say which")
    if name not in GPUS:
        raise SpecError(
            "gpu", name,
            f"unknown GPU; {nearest(name, GPUS)}choose one of {', '.join(GPUS)} (see `simpar gpus`)"
        )
    return GPUS[name]


# DGX-like node per GPU type: NVLink per GPU per direction and NIC per GPU (vendor
# DGX/HGX datasheets).
_NODE = {
    # DGX-1V: NVLink2 hybrid cube mesh, 6 links x 25 GB/s; 4x 100 Gb/s EDR for 8 GPUs
    # (~6.25 GB/s per GPU)
    "v100-32gb": (150.0, 6.25),
    # DGX A100: NVLink3 12 links x 25 GB/s = 300 GB/s; 8x 200 Gb/s HDR (25 GB/s per GPU)
    "a100-40gb": (300.0, 25.0),
    "a100-80gb": (300.0, 25.0),
    # DGX H100: NVLink4 18 links = 450 GB/s per direction; 8x 400 Gb/s NDR (50 GB/s per GPU)
    "h100-sxm": (450.0, 50.0),
    # Grand Teton: 8 H100 per host on NVLink4, 400 Gb/s RDMA per GPU (torchtitan's benchmark pages)
    "h100-sxm-96gb": (450.0, 50.0),
    # PCIe H100 servers: NVLink bridge pairs only; PCIe Gen5 x16 ~ 64 GB/s is the
    # all-GPU path; 400 Gb/s NIC
    "h100-pcie": (64.0, 50.0),
    # HGX H200: as DGX H100
    "h200": (450.0, 50.0),
    # DGX B200: NVLink5 = 900 GB/s per direction; 8x 400 Gb/s ConnectX-7
    "b200": (900.0, 50.0),
    # MI300X platform: Infinity Fabric 7 links x 64 GB/s = 448 GB/s per GPU; 8x 400 Gb/s
    "mi300x": (448.0, 50.0),
    "mi325x": (448.0, 50.0),
    # H800 / A800 HGX: NVLink at 400 GB/s both directions = 200 per direction
    # (DeepSeek-V3 paper: ~160 GB/s achieved on H800, i.e. our 0.8 link efficiency); 8x
    # 400 Gb/s IB (50 GB/s per GPU) and 8x 200 Gb/s
    "h800": (200.0, 50.0),
    "a800-80gb": (200.0, 25.0),
    # GB200 / GB300 NVL72: NVLink5 (900 GB/s per direction) through the rack's NVLink
    # Switch trays to all 72 GPUs; scale-out ConnectX-7 400 Gb/s per GPU (GB200) and
    # ConnectX-8 800 Gb/s (GB300) (NVIDIA datasheets)
    "gb200": (900.0, 50.0),
    "gb300": (900.0, 100.0),
    # HGX B300: NVLink5 in an 8-GPU node, ConnectX-8 800 Gb/s per GPU
    "b300": (900.0, 100.0),
    # MI355X platform: 7 Infinity Fabric links at 153.6 GB/s (both directions) = 537.6
    # per direction; 400 Gb/s NICs
    "mi355x": (537.6, 50.0),
    # GH200: NVLink4 (450 GB/s per direction) to the other superchips of an NVL system; 400 Gb/s per
    # GPU. Machines with 4 GH200 per node and Slingshot (e.g. Alps) need their own cluster file.
    "gh200": (450.0, 50.0),
}
# GPUs that share one NVLink domain where it is not a node of eight: a rack of NVLink Switch trays
NVLINK_DOMAIN = {"gb200": 72, "gb300": 72}
# NCCL per-step latencies: ~2 us on NVLink, ~5 us across InfiniBand (nccl-tests
# small-message all-reduce).
_LAT_INTRA_US, _LAT_INTER_US = 2.0, 5.0
# GPUs whose reference nodes have AMD x86 hosts, where NCCL (and RCCL) post to the network at 2 us a
# message, not 1: DGX A100 (two EPYC 7742) and AMD's Instinct platforms (EPYC). DGX H100/H200/B200
# hosts are Intel Xeons and the Grace-Blackwell racks' are Arm.
AMD_HOSTS = ("a100-40gb", "a100-80gb", "mi300x", "mi325x", "mi355x")
# The fabric of a DGX SuperPOD: rail-optimized, non-blocking three-tier fat-tree of
# 64-port switches.
DGX_FABRIC = TopologySpec("fat-tree",
                          (("leaf_radix", 64), ("leaf_oversubscription", 1.0), ("nics_per_node", 0),
                           ("rail_optimized", True), ("spine_oversubscription", 1.0),
                           ("spine_radix", 64), ("switch_latency_us", 0.6), ("tiers", 3)))


def dgx_like(gpu_name: str, name: str | None = None) -> ClusterSpec:
    """Nodes of eight `gpu_name` GPUs, DGX-style, on a rail-optimized non-blocking fat-tree."""
    gpu = resolve_gpu(gpu_name)
    nvlink, nic = _NODE[gpu.name]
    per_domain = NVLINK_DOMAIN.get(gpu.name, 8)
    default = f"{gpu.name}-nvl{per_domain}" if per_domain != 8 else f"{gpu.name}-node"
    post = AMD_HOST_NET_POST_US if gpu.name in AMD_HOSTS else NET_POST_US
    return ClusterSpec(name or default, gpu, per_domain, nvlink, _LAT_INTRA_US, nic, _LAT_INTER_US,
                       topology=DGX_FABRIC, net_post_us=post)


def builtin_clusters() -> dict[str, Path]:
    """Cluster files shipped in the `topologies` folder, by name."""
    folder = Path(__file__).resolve().parents[2] / "topologies"
    if not folder.is_dir():  # installed as a package
        import topologies
        folder = Path(topologies.__file__).parent
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


# NVIDIA's names for its Grace-Blackwell racks (DGX GB200 and GB300: NVL72 racks), as the
# Megatron-Bridge tables head their systems, in names.normal_form
CLUSTER_ALIASES = {"dgx-gb200": "gb200-nvl72", "dgx-gb200-nvl72": "gb200-nvl72",
                   "dgx-gb300": "gb300-nvl72", "dgx-gb300-nvl72": "gb300-nvl72"}


def load_cluster(cluster: str | None, gpu: str | None) -> ClusterSpec:
    """`--cluster NAME|PATH` or `--gpu NAME` (a DGX-like default for that GPU); --gpu
    overrides the GPU."""
    from simpar.specs.loaders import looks_like_path, read_mapping

    if cluster is None:
        if gpu is None:
            raise SpecError(
                "cluster/gpu", None,
                f"give --gpu ({', '.join(GPUS)}) or --cluster ({', '.join(builtin_clusters())})")
        return dgx_like(gpu)
    known = builtin_clusters()
    cluster = canonical(cluster, known, CLUSTER_ALIASES)
    if cluster in known:
        spec = ClusterSpec.from_dict(read_mapping(known[cluster], "cluster"), source=cluster)
    elif looks_like_path(cluster):
        spec = ClusterSpec.from_dict(read_mapping(cluster, "cluster"), source=cluster)
    else:
        raise SpecError(
            "cluster", cluster,
            f"unknown cluster; {nearest(cluster, known)}choose one of {', '.join(known)} or give a "
            "YAML file")
    return replace(spec, gpu=resolve_gpu(gpu)) if gpu else spec
