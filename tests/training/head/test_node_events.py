"""Why a drained node went, from its Node object: the monitoring agent's failed condition is a
repair, a Spot node's drain a reclaim, anything else (or no API) "drained", never an error."""

from __future__ import annotations

from training.head.kube_api import KubeAPI, KubeAPIError
from training.head.node_events import classify, node_reason
from training.run.node_notices import NodeEvent


def _node(conditions=(), capacity="ON_DEMAND") -> dict:
    return {"metadata": {"labels": {"eks.amazonaws.com/capacityType": capacity}},
            "status": {"conditions": [{"type": t, "status": s, "reason": r}
                                      for t, s, r in conditions]}}


def test_a_failed_monitoring_condition_is_a_repair_and_a_spot_node_a_reclaim():
    sick = _node([("Ready", "True", None), ("AcceleratedHardwareReady", "False",
                                            "NvidiaXID79Error")], capacity="SPOT")
    assert node_reason(sick) == ("repair", "AcceleratedHardwareReady=False (NvidiaXID79Error)")
    assert node_reason(_node([("Ready", "True", None)], capacity="SPOT"))[0] == "spot-reclaim"
    assert node_reason(_node([("Ready", "True", None)])) == ("drained", None)


class _Api(KubeAPI):
    def __init__(self, nodes):
        super().__init__("http://127.0.0.1:1")
        object.__setattr__(self, "nodes", nodes)

    def node(self, name):
        if name not in self.nodes:
            raise KubeAPIError(f"GET /api/v1/nodes/{name}: HTTP 404 not found")
        return self.nodes[name]


def test_an_unknown_node_or_no_api_is_drained_never_an_error():
    assert classify(("gone",), _Api({}))[0] == "drained"
    assert classify(("a",), None) == ("drained", "no Kubernetes API here")
    api = _Api({"a": _node([("Ready", "True", None)]),
                "b": _node([("NetworkingReady", "False", "InterfaceNotUp")])})
    assert classify(("a", "b"), api)[0] == "repair"
    assert set(NodeEvent(1.0, ("r",), ("a",), 3).to_dict()) == {
        "time", "ray_nodes", "kube_nodes", "step_saved"}
