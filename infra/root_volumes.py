"""The nodes' gp3 root volumes, sized for pulling the multi-GiB Ray Train image, and their price.

containerd writes every pulled layer to the root volume and then unpacks it there, so at gp3's
baseline of 125 MiB/s writing a 15 GB image alone takes minutes. nodeadm's docs for the
FastImagePull gate (awslabs/amazon-eks-ami nodeadm/doc/examples.md, "Enabling fast image pull")
recommend at least 600 MiB/s of root throughput ("below that value, you may see longer image pull
times with this flag") and say "higher values up to 1000MiB/s and 16k IOPs may result in better
performance". gp3 limits (EBS user guide, general-purpose "gp3 volumes"): up to
1000 MiB/s at 0.25 MiB/s per provisioned IOPS, up to 500 IOPS per GiB; 125 MiB/s and 3,000 IOPS
are free, more is billed (stack/catalog.py PRICES_USD_PER_HOUR, per Region)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

GP3_BASELINE_MIBPS, GP3_BASELINE_IOPS = 125, 3000
GP3_MAX_MIBPS, GP3_MAX_IOPS = 1000, 16000
GP3_MIBPS_PER_IOPS, GP3_IOPS_PER_GIB = 0.25, 500


@dataclass(frozen=True)
class RootVolume:
    gib: int
    throughput_mibps: int
    iops: int

    def problems(self) -> list[str]:
        """What EBS would refuse in this gp3 volume (CreateVolume fails at node launch)."""
        p = []
        if not GP3_BASELINE_MIBPS <= self.throughput_mibps <= GP3_MAX_MIBPS:
            p.append(f"throughput {self.throughput_mibps} MiB/s outside 125..1000")
        if not GP3_BASELINE_IOPS <= self.iops <= min(GP3_MAX_IOPS, GP3_IOPS_PER_GIB * self.gib):
            p.append(f"{self.iops} IOPS outside 3000..min(16000, 500 per GiB)")
        if self.throughput_mibps > GP3_MIBPS_PER_IOPS * self.iops:
            p.append(f"{self.throughput_mibps} MiB/s needs at least "
                     f"{int(self.throughput_mibps / GP3_MIBPS_PER_IOPS)} IOPS")
        return p

    def ebs(self) -> dict:
        """The launch template's `ebs` block: encrypted, deleted with the node."""
        return {"volume_size": self.gib, "volume_type": "gp3", "throughput": self.throughput_mibps,
                "iops": self.iops, "encrypted": "true", "delete_on_termination": "true"}

    def storage_usd_per_hour(self, price: Mapping[str, float]) -> float:
        """At `price`, a Region's prices (stack.catalog.region_prices)."""
        return self.gib * price["gp3-gb"]

    def performance_usd_per_hour(self, price: Mapping[str, float]) -> float:
        """Throughput and IOPS above gp3's free baseline, at `price`."""
        return ((self.throughput_mibps - GP3_BASELINE_MIBPS) * price["gp3-mibps"]
                + (self.iops - GP3_BASELINE_IOPS) * price["gp3-iops"])


# The system node runs the Ray head and the job submitter in the full Ray Train CUDA image (many
# GiB unpacked): the EKS default of 20 GiB ends in failed pulls or DiskPressure evictions. It is
# always on, so it gets nodeadm's recommended floor, not the maximum; its head pod's image pull
# overlaps the GPU nodes' boot.
SYSTEM_ROOT = RootVolume(gib=100, throughput_mibps=600, iops=3000)
# GPU nodes exist only during a run and pull the image on its critical path: nodeadm's upper figure.
GPU_THROUGHPUT_MIBPS, GPU_IOPS = 1000, 16000


def gpu_root(gib: int) -> RootVolume:
    return RootVolume(gib=gib, throughput_mibps=GPU_THROUGHPUT_MIBPS, iops=GPU_IOPS)
