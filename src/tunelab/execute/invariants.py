"""Figures that must agree across every run of a study (a workload's
:meth:`~tunelab.workload.Workload.invariants`, e.g. pw.x's total energy), and runs that
measured another configuration than the one asked for.

The reference of an invariant is the value the most judged runs agree with: the first valid
run sets it, and when a later run disagrees while more runs agree with it than with the
reference, the reference moves and the stored runs are judged again, on every invariant, in
one transaction (:meth:`~tunelab.store.Store.rejudge`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunelab.execute.study import Study
    from tunelab.store import Store

__all__ = ["check_invariants"]


def check_invariants(study: Study, store: Store, params: Mapping[str, object],
                     foms: dict[str, float]) -> tuple[str, str | None]:
    """``invalid`` when the program reports having run another configuration than
    ``params`` (:meth:`~tunelab.workload.Workload.configuration_problem`), or when a FOM
    that must agree across runs differs from the study's reference by more than its
    tolerance.

    The reference is the value the most judged runs agree with: the first valid run sets
    it, and when a run disagrees while more runs agree with it (itself included) than with
    the reference, the reference moves to its value and the stored runs are judged again
    (:func:`_move_reference`): the first run was the odd one out."""
    other = study.workload.configuration_problem(params, foms)
    if other is not None:
        return "invalid", other
    problems = []
    invariants = study.workload.invariants()
    for name, tolerance in invariants.items():
        if name not in foms:
            continue
        ref_raw = store.get_meta(f"reference.{name}")
        if ref_raw is None:
            store.set_meta({f"reference.{name}": repr(foms[name])})
            continue
        ref = _move_reference(store, invariants, name, foms[name], float(ref_raw))
        diff = abs(foms[name] - ref)
        if diff > tolerance:
            problems.append(_differs(name, foms[name], ref, tolerance))
    return ("invalid", "; ".join(problems)) if problems else ("ok", None)


def _differs(name: str, value: float, ref: float, tolerance: float, why: str = "") -> str:
    return (f"{name} differs by {abs(value - ref):.2g} > {tolerance:g} from the study's "
            f"reference ({value!r} vs {ref!r}){why}")


def _judged(store: Store, invariants: Mapping[str, float]
            ) -> dict[int, tuple[str, str, dict[str, float]]]:
    """run id -> (status, reason, its values of the invariant FOMs) of the runs judged on
    the invariants: those stored ok and those invalid only because invariants differ (a
    run invalid for another reason keeps its status: its figures measured another
    configuration)."""
    def invariants_only(why: str) -> bool:
        return all(any(part.startswith(f"{n} differs by ") for n in invariants)
                   for part in why.split("; "))

    runs: dict[int, tuple[str, str, dict[str, float]]] = {}
    for name in invariants:
        for run_id, status, why, value in store.judged_runs(name):
            if status == "ok" or invariants_only(why):
                runs.setdefault(run_id, (status, why, {}))[2][name] = value
    return runs


def _move_reference(store: Store, invariants: Mapping[str, float], name: str, value: float,
                    ref: float) -> float:
    """The reference of invariant ``name`` once a run of ``value`` is judged: ``ref``, or
    ``value`` when more judged runs (:func:`_judged`) agree with it (this one included)
    than with ``ref``, in which case the judged runs are judged again on every invariant,
    in one transaction: a run keeps no reason that no longer holds, and gains the ones
    that now do."""
    tolerance = invariants[name]
    if abs(value - ref) <= tolerance:
        return ref
    judged = _judged(store, invariants)
    mine = [vals[name] for _, _, vals in judged.values() if name in vals]
    agree = 1 + sum(abs(v - value) <= tolerance for v in mine)
    confirm = sum(abs(v - ref) <= tolerance for v in mine)
    if agree <= confirm:
        return ref
    why = (f", which {agree} runs agree on: judged again when they outnumbered the "
           f"{confirm} that agreed with the first valid run's {ref!r}")
    refs = {n: float(raw) for n in invariants
            if (raw := store.get_meta(f"reference.{n}")) is not None}
    refs[name] = value
    verdicts: dict[int, tuple[str, str | None]] = {}
    for run_id, (status, reason, vals) in judged.items():
        kept = {n: part for part in reason.split("; ") for n in invariants
                if part.startswith(f"{n} differs by ")}
        problems = [_differs(n, v, refs[n], invariants[n], why) if n == name
                    else kept.get(n) or _differs(n, v, refs[n], invariants[n])
                    for n, v in vals.items()
                    if n in refs and abs(v - refs[n]) > invariants[n]]
        verdict = ("invalid", "; ".join(problems)) if problems else ("ok", None)
        if verdict != (status, reason or None):
            verdicts[run_id] = verdict
    store.rejudge(verdicts, {f"reference.{name}": repr(value)})
    return value
