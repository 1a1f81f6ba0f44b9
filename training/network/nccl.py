"""Which transport NCCL really used, read from NCCL_DEBUG=INFO output.

`python -m training.network.nccl LOG [LOG...] [--expect efa|any]` prints one JSON verdict and exits 0 when it
satisfies --expect, 3 when it does not, 2 when the input is unreadable or holds no NCCL lines.

"Using network Socket" alone proves nothing: a healthy single-node run prints it too and then moves
every byte over P2P/SHM. The verdict comes from the channel lines (`via NET/Libfabric/0`,
`via NET/Socket/0`, `via P2P/...`) and each communicator's `nNodes`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field

VERDICTS = ("efa", "socket-fallback", "single-node", "ib", "unknown")
EXIT_OK, EXIT_UNREADABLE, EXIT_UNEXPECTED = 0, 2, 3

_CHANNEL = re.compile(r"Channel \d+/\d+ : .* via (?P<via>\S+(?: Libfabric\S*)?)")
_COMM = re.compile(r"\bnRanks \d+ nNodes (?P<nodes>\d+)")
_NETWORK = re.compile(r"Using network (?P<net>.+?)\s*$")
_OFI_INIT = re.compile(r"NET/OFI Initializing (?P<plugin>aws-ofi-nccl \S+)")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>\w+)")
_PLUGIN_FAILED = re.compile(r"aws-ofi-nccl initialization failed|Initializing plugin failed|"
                            r"No eligible providers|NET/OFI .*(?:failed|Unable)", re.I)
_MAX_EVIDENCE = 12


@dataclass
class Facts:
    """What the lines of one or more logs say, before a verdict is drawn."""

    nccl_lines: int = 0
    nodes: set[int] = field(default_factory=set)
    transports: set[str] = field(default_factory=set)  # NET/... transports seen on channel lines
    intra_node: bool = False  # P2P/SHM channels seen
    networks: set[str] = field(default_factory=set)
    plugin: str | None = None
    provider: str | None = None
    plugin_failed: bool = False
    evidence: list[str] = field(default_factory=list)

    def merge(self, other: "Facts") -> "Facts":
        return Facts(
            nccl_lines=self.nccl_lines + other.nccl_lines, nodes=self.nodes | other.nodes,
            transports=self.transports | other.transports,
            intra_node=self.intra_node or other.intra_node, networks=self.networks | other.networks,
            plugin=self.plugin or other.plugin, provider=self.provider or other.provider,
            plugin_failed=self.plugin_failed or other.plugin_failed,
            evidence=_dedup(self.evidence + other.evidence))

    def to_json(self) -> dict:
        return {**self.__dict__, "nodes": sorted(self.nodes), "transports": sorted(self.transports),
                "networks": sorted(self.networks)}

    @classmethod
    def from_json(cls, d: dict) -> "Facts":
        return cls(**{**d, "nodes": set(d["nodes"]), "transports": set(d["transports"]),
                      "networks": set(d["networks"])})


def _transport_name(via: str) -> str | None:
    """`NET/Libfabric/0/GDRDMA` -> `NET/Libfabric`; `NET/AWS Libfabric/0` -> `NET/Libfabric`."""
    if not via.startswith("NET/"):
        return None
    name = via.split("/")[1]
    return "NET/Libfabric" if "Libfabric" in name else f"NET/{name}"


def parse(lines) -> Facts:
    facts = Facts()
    evidence: list[str] = []
    for raw in lines:
        line = raw.rstrip("\n")
        if "NCCL INFO" not in line and "NCCL WARN" not in line:
            continue
        facts.nccl_lines += 1
        keep = False
        if m := _CHANNEL.search(line):
            transport = _transport_name(m["via"])
            if transport:
                keep = transport not in facts.transports
                facts.transports.add(transport)
            elif not facts.intra_node:
                facts.intra_node = keep = True
        elif m := _COMM.search(line):
            keep = int(m["nodes"]) not in facts.nodes
            facts.nodes.add(int(m["nodes"]))
        elif m := _NETWORK.search(line):
            facts.networks.add(m["net"])
            keep = True
        elif m := _OFI_INIT.search(line):
            facts.plugin, keep = m["plugin"], True
        elif m := _OFI_PROVIDER.search(line):
            facts.provider, keep = m["provider"], True
        elif _PLUGIN_FAILED.search(line):
            facts.plugin_failed = keep = True
        if keep:
            evidence.append(line.split("NCCL ", 1)[-1] if "NCCL " in line else line)
    facts.evidence = _dedup(evidence)
    return facts


def verdict(facts: Facts) -> str:
    """One of VERDICTS: which transport carried inter-node traffic (or that there was none)."""
    if "NET/Socket" in facts.transports:
        return "socket-fallback"
    if "NET/Libfabric" in facts.transports:
        return "efa"
    if "NET/IB" in facts.transports:
        return "ib"
    multi_node = any(n > 1 for n in facts.nodes)
    if not multi_node and facts.nodes:
        return "single-node"
    if multi_node:  # no channel lines yet (NCCL connects lazily): fall back to the chosen network
        if any("Libfabric" in n for n in facts.networks):
            return "efa"
        if "Socket" in facts.networks:
            return "socket-fallback"
        if "IB" in facts.networks:
            return "ib"
    return "unknown"


def report(facts: Facts) -> dict:
    """The CLI's JSON object."""
    plugin = facts.plugin or next((n for n in sorted(facts.networks) if n != "Socket"), None)
    return {
        "verdict": verdict(facts),
        "nodes": max(facts.nodes) if facts.nodes else None,
        "plugin": plugin,
        "inter_node_transports": sorted(facts.transports),
        "evidence": facts.evidence[:_MAX_EVIDENCE],
    }


def satisfies(v: str, expect: str) -> bool:
    return expect == "any" or v == expect


def explain(v: str, facts: Facts) -> str:
    """Cause and fix for a verdict that is not EFA, for the job's error message."""
    if v == "socket-fallback":
        cause = ("the aws-ofi-nccl plugin failed to initialize" if facts.plugin_failed else
                 "no EFA network plugin was used")
        return ("NCCL sent inter-node traffic over TCP sockets (channels via NET/Socket), not EFA: "
                f"{cause}. Training still runs, ~8x slower (measured). Check that the worker pod "
                "requests `vpc.amazonaws.com/efa: 1` (kubectl describe pod), that the EFA device "
                "plugin DaemonSet runs on the GPU node, and that the image's aws-ofi-nccl library "
                "loads (NCCL_NET_PLUGIN, LD_LIBRARY_PATH). Set NCCL_NET='Libfabric' to make "
                "NCCL fail instead of falling back, or pass --on-fallback warn to continue.")
    if v == "single-node":
        return ("all ranks are on one node, so no traffic crossed EFA; --expect-transport efa "
                "needs a job spanning several nodes (use --expect-transport any for one node)")
    if v == "ib":
        return "NCCL used InfiniBand verbs (NET/IB), not the EFA libfabric plugin"
    return ("the NCCL log shows no channel or communicator lines to decide from; run with "
            "NCCL_DEBUG=INFO and after at least one collective")


def _dedup(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.network.nccl", description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", metavar="LOG", help="NCCL_DEBUG=INFO output, one file per rank")
    ap.add_argument("--expect", choices=("efa", "any"), default="any")
    args = ap.parse_args(argv)
    facts = Facts()
    for path in args.logs:
        try:
            with open(path, errors="replace") as f:
                facts = facts.merge(parse(f))
        except OSError as e:
            print(f"error: cannot read {path}: {e.strerror}", file=sys.stderr)
            return EXIT_UNREADABLE
    if facts.nccl_lines == 0:
        print(f"error: no NCCL lines in {', '.join(args.logs)} (was NCCL_DEBUG=INFO set?)",
              file=sys.stderr)
        return EXIT_UNREADABLE
    result = report(facts)
    print(json.dumps(result))
    return EXIT_OK if satisfies(result["verdict"], args.expect) else EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
