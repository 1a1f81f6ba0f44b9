"""`image` pinned by digest, for a byte-exact rerun: a well-formed digest is taken, any other refused."""

from __future__ import annotations

import pytest

from tests.stack.test_data_buckets import problems

REPO = "public.ecr.aws/deep-learning-containers/ray"
HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize("image", [f"{REPO}@sha256:{HEX}", f"{REPO}:2.54.0@sha256:{HEX}"])
def test_an_image_pinned_by_digest_is_taken(image):
    assert problems(image=image) == []


@pytest.mark.parametrize("image", [f"{REPO}@sha256:{HEX[:-1]}", f"{REPO}@sha256:{HEX.upper()}",
                                   f"{REPO}@sha512:{HEX}", f"{REPO}@{HEX}", f"{REPO}@sha256:"])
def test_a_malformed_digest_is_refused(image):
    assert any(p.startswith("image:") and "repo@sha256:<64 hex>" in p for p in problems(image=image))
