"""The digest of the image a run's pods ran, from their status, as the runtimes report it."""

from __future__ import annotations

from training.head import cold_start

HEX = "0123456789abcdef" * 4


def pod(image_id: str, name: str = "ray-worker", extra: tuple = ()) -> dict:
    return {"metadata": {"name": "w", "uid": "u"},
            "spec": {"containers": [{"name": name}, *({"name": n} for n, _ in extra)]},
            "status": {"containerStatuses": [*({"name": n, "imageID": i} for n, i in extra),
                                              {"name": name, "imageID": image_id}]}}


def test_the_ray_containers_digest_as_containerd_and_dockershim_write_it():
    assert cold_start.image_digest(pod(f"public.ecr.aws/x/ray@sha256:{HEX}")) == f"sha256:{HEX}"
    assert cold_start.image_digest(pod(f"docker-pullable://r/ray@sha256:{HEX}")) == f"sha256:{HEX}"


def test_a_sidecars_image_is_not_the_runs():
    side = ("fluent", f"r/fluent@sha256:{'f' * 64}")
    assert cold_start.image_digest(pod(f"r/ray@sha256:{HEX}", extra=(side,))) == f"sha256:{HEX}"


def test_a_pod_not_started_yet_has_no_digest():
    assert cold_start.image_digest(pod("")) is None
    assert cold_start.image_digest({"metadata": {}, "status": {}}) is None


def test_the_timeline_records_every_workers_digest():
    other = "f" * 64
    pods = [cold_start._pod_view(pod(f"r@sha256:{h}"), [], None) for h in (HEX, HEX, other)]
    t = cold_start.timeline({"rayjob_created": None, "pods": pods}, {}, None)
    assert t["image_digest"] == f"sha256:{HEX},sha256:{other}"  # a tag that moved mid-run
