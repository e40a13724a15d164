"""The fraction of bound per point: a study's runs, the workload's account of each run and
a profile, joined (pure; no machine measured)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import pytest

from tunelab.bounds.headroom import study_headroom
from tunelab.bounds.profile import Bound, Profile
from tunelab.workload import Command, Work, Workload

MiB = 1 << 20


class Exchanger(Workload):
    """A stand-in workload whose runs exchange bytes (FOM ``bw``) and compute (``flops``)."""

    name = "exchanger"

    @classmethod
    def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
             foms: Mapping[str, float]) -> list[Work]:
        out = [Work("link", foms["bw"], {"stack": f"mpi-{values['pml']}", "ranks": 2,
                                         "message_bytes": options["size"]}, 1e6, "exchange")]
        if "flops" in foms:
            out.append(Work("gemm", foms["flops"], {"precision": "fp32"}, 1e9, "compute"))
        return out

    def command(self, ctx: Any) -> Command:  # pragma: no cover - never run
        raise NotImplementedError

    def parse(self, stdout: str, stderr: str, run_dir: Any) -> dict[str, float]:
        raise NotImplementedError  # pragma: no cover


def runs(rows: list[tuple[str, str, dict[str, float]]]) -> pd.DataFrame:
    out = []
    for i, (pml, status, foms) in enumerate(rows):
        out.append({"run_id": i + 1, "point": json.dumps({"pml": pml}), "status": status,
                    "pml": pml, **{f"fom.{k}": v for k, v in foms.items()}})
    return pd.DataFrame(out)


def link(stack: str, pattern: str, value: float) -> Bound:
    return Bound("link", {"stack": stack, "pattern": pattern, "ranks": 2, "nodes": 1,
                          "message_bytes": 4 * MiB}, value)


PROFILE = Profile("abc", {"host": "h"}, "now", (
    link("mpi-ucx", "alltoall", 2e9), link("mpi-ucx", "oneway", 4e9),
    link("mpi-ob1", "alltoall", 1e9), Bound("gemm", {"precision": "fp32"}, 10e9)))


def test_fractions_are_means_over_a_points_ok_runs_beside_the_one_way_bound():
    table = runs([("ucx", "ok", {"bw": 1.0e9}), ("ucx", "ok", {"bw": 2.0e9}),
                  ("ucx", "failed", {"bw": 9e9}), ("ob1", "ok", {"bw": 0.9e9, "flops": 5e9})])
    h = study_headroom(table, Exchanger, {"size": 4 * MiB}, PROFILE)
    assert h is not None and h.kinds == ["link", "gemm"]
    ucx = h.points[json.dumps({"pml": "ucx"})]
    (item,) = ucx.items
    assert item.n == 2 and item.fraction == pytest.approx(0.75)  # (0.5 + 1.0) / 2
    assert (item.low, item.high) == (pytest.approx(0.5), pytest.approx(1.0))
    assert item.oneway == pytest.approx(0.375) and item.oneway_bound.value == 4e9
    assert item.rate == pytest.approx(1.5e9) and item.amount == 1e6
    ob1 = h.points[json.dumps({"pml": "ob1"})]
    assert ob1.binding is not None and ob1.binding.kind == "link"  # 0.9 of link, 0.5 of gemm
    assert [round(i.fraction, 2) for i in ob1.items] == [0.9, 0.5]
    assert math.isnan(ob1.items[0].oneway)  # no one-way bound over ob1 was measured


def test_without_a_profile_the_work_is_known_but_judged_against_nothing():
    h = study_headroom(runs([("ucx", "ok", {"bw": 1e9})]), Exchanger, {"size": 1}, None)
    assert h is not None and h.profile is None
    (point,) = h.points.values()
    assert point.items[0].bound is None and point.binding is None
    assert point.items[0].label.startswith("link (")


def test_a_workload_that_declares_nothing_has_no_headroom():
    class Silent(Exchanger):
        @classmethod
        def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
                 foms: Mapping[str, float]) -> list[Work]:
            return []

    assert study_headroom(runs([("ucx", "ok", {"bw": 1e9})]), Silent, {}, PROFILE) is None
    assert study_headroom(runs([]), Exchanger, {}, PROFILE) is None


def test_a_run_whose_account_cannot_be_read_is_left_out():
    table = runs([("ucx", "ok", {"other": 1.0}), ("ucx", "ok", {"bw": 2e9})])
    h = study_headroom(table, Exchanger, {"size": 4 * MiB}, PROFILE)
    assert h is not None
    assert next(iter(h.points.values())).items[0].n == 1  # the KeyError run says nothing
