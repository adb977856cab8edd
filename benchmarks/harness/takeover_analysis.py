"""The takeover benchmark's analysis (``benchmarks/takeover.py``): each run's completion
and pauses, each taken-over stream's timeline, the survivors' shares, and the bound the
longest pause is held to::

    lease + detection + re-prefill tokens / (sum of the survivors' measured prefill rates)

(``KVRELAY_LEASE_TTL`` + ``KVRELAY_WATCHDOG_INTERVAL`` + the prompt and tokens so far of
every taken-over job over the prefill rates the survivors' heartbeats report, which is
survivors x rate for equal survivors): the takeover throttle shares the re-prefill by
speed, so the survivors finish it together.
"""

from __future__ import annotations

import datetime
import itertools
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.latency import percentiles
from harness.takeover_streams import KillPlan, StartedSeen, StreamRecord

_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):.*job ([0-9a-f]+) lost its "
                       r"worker; requeueing it")


def detections(logs: Sequence[Path]) -> dict[str, float]:
    """Job id -> when a survivor's watchdog first judged it lost (its log's local time)."""
    found: dict[str, float] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            match = _LOG_LINE.match(line)
            if match:
                when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                job_id = match.group(2)
                found[job_id] = min(found.get(job_id, when.timestamp()), when.timestamp())
    return found


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """p50/p90/max (and the count) of ``values`` in seconds, rounded to ms."""
    if not values:
        return None
    points = percentiles(values, (50, 90))
    return {"n": len(values), "p50": round(points["p50"], 3), "p90": round(points["p90"], 3),
            "max": round(max(values), 3)}


def run_summary(records: list[StreamRecord], start: float, reference: list[list[int]] | None
                ) -> dict[str, Any]:
    """Completion, identity with ``reference``, pauses and throughput of one run."""
    finished = [r for r in records if r.done and r.error is None]
    end = max((r.times[-1] for r in records if r.times), default=start)
    longest = max(records, key=lambda r: r.longest_pause())
    summary: dict[str, Any] = {
        "streams": len(records), "completed": len(finished),
        "errors": {r.index: r.error for r in records if r.error},
        "wall_s": round(end - start, 2),
        "output_tok_s": round(sum(len(r.tokens) for r in records) / max(end - start, 1e-9), 1),
        "streams_per_final_worker": dict(Counter(r.worker for r in records)),
        "longest_pause_s": round(longest.longest_pause(), 3),
        "longest_pause_stream": longest.index,
        "longest_pause_per_stream": spread([r.longest_pause() for r in records]),
        "seq_increasing": all(a < b for r in records for a, b in zip(r.seqs, r.seqs[1:],
                                                                        strict=False)),
        # Chunks skip the seq of a later ``Started`` (a takeover's): streams with a skip.
        "streams_with_seq_skips": sum(any(b - a > 1 for a, b in zip(r.seqs, r.seqs[1:],
                                                                     strict=False))
                                      for r in records),
    }
    if reference is not None:
        summary["token_identical"] = sum(r.tokens == ref for r, ref in
                                         zip(records, reference, strict=True))
    return summary


def takeover_breakdown(records: list[StreamRecord], started: dict[str, list[StartedSeen]],
                       plan: KillPlan, detected: dict[str, float]) -> dict[str, Any]:
    """Per taken-over stream, the timeline of its pause (seconds from the kill), and the
    spread of each phase over those streams."""
    kill = plan.killed_at
    rows: list[dict[str, Any]] = []
    for r in records:
        if r.job_id not in plan.expiry:
            continue
        before = [t for t in r.times if t <= kill]
        after = [t for t in r.times if t > kill]
        second = [s for s in started.get(r.job_id, []) if s.attempt >= 2]
        points = {
            "last_token": before[-1] if before else None,
            "lease_expiry": plan.expiry.get(r.job_id),
            "detected": detected.get(r.job_id),
            "requeued": plan.requeued.get(r.job_id),
            "claimed": plan.claimed.get(r.job_id),
            "started_seen": second[0].at if second else None,
            "first_token": after[0] if after else None,
        }
        row: dict[str, Any] = {"stream": r.index, "job_id": r.job_id,
                               "claimed_by": plan.claimed_by.get(r.job_id),
                               "prompt_tokens": second[0].prompt_tokens if second else None,
                               "tokens_before_kill": sum(n for t, n in zip(r.times, r.sizes,
                                                                           strict=True)
                                                         if t <= kill),
                               "pause_s": round(after[0] - before[-1], 3)
                               if before and after else None,
                               "longest_pause_s": round(r.longest_pause(), 3)}
        row.update({k: None if v is None else round(v - kill, 3) for k, v in points.items()})
        rows.append(row)
    phases = {
        "last_token_to_kill": ("last_token", None),
        "kill_to_lease_expiry": (None, "lease_expiry"),
        "lease_expiry_to_detection": ("lease_expiry", "detected"),
        "detection_to_requeued": ("detected", "requeued"),
        "requeued_to_claimed": ("requeued", "claimed"),
        "detection_to_claimed": ("detected", "claimed"),
        "claimed_to_started_seen": ("claimed", "started_seen"),
        "claimed_to_first_token": ("claimed", "first_token"),
        "kill_to_first_token": (None, "first_token"),
    }
    spreads: dict[str, Any] = {}
    for name, (a, b) in phases.items():
        values = [(row[b] if b else 0.0) - (row[a] if a else 0.0) for row in rows
                  if (a is None or row[a] is not None) and (b is None or row[b] is not None)]
        spreads[name] = spread(values)
    spreads["pause"] = spread([row["pause_s"] for row in rows if row["pause_s"] is not None])
    return {"streams": rows, "phases_s": spreads}


def recovery(records: list[StreamRecord], plan: KillPlan, breakdown: dict[str, Any],
             heartbeats: list[dict[str, Any]]) -> dict[str, Any]:
    """The survivors during the recovery: their own streams' pauses, the work re-prefilled
    (in all and per survivor), each one's measured prefill rate (its latest heartbeat)
    and its engine's queue from its heartbeats."""
    kill = plan.killed_at
    survivor_streams = [r for r in records if r.job_id not in plan.expiry]
    rows = breakdown["streams"]
    claims = [row["claimed"] for row in rows if row["claimed"] is not None]
    firsts = [row["first_token"] for row in rows if row["first_token"] is not None]
    reprefill = sum(_reprefill(row) for row in rows)
    window = (max(firsts) - min(claims)) if claims and firsts else None
    victim_pid = plan.pids.get(plan.victim)
    timeline = [dict(s, at=round(s["at"] - kill, 2)) for s in heartbeats
                if s["pid"] != victim_pid and -2 <= s["at"] - kill <= (max(firsts, default=0) + 3)]
    survivors: dict[str, dict[str, Any]] = {}
    for name, pid in sorted(plan.pids.items()):
        if name == plan.victim:
            continue
        beats = [s for s in heartbeats if s["pid"] == pid]
        mine = [row for row in rows if row["claimed_by"] == name]
        survivors[name] = {
            "taken_over": len(mine), "reprefill_tokens": sum(_reprefill(r) for r in mine),
            "prefill_tokens_per_s": round(float(beats[-1].get("prefill_tokens_per_s") or 0), 1)
            if beats else None,
        }
    return {
        "survivor_own_streams": len(survivor_streams),
        "survivor_longest_pause_after_kill": spread(
            [r.longest_pause(after=kill) for r in survivor_streams]),
        "reprefill_tokens": reprefill,
        "first_claim_to_last_first_token_s": None if window is None else round(window, 3),
        "reprefill_tokens_per_s": None if not window else round(reprefill / window, 1),
        "survivors": survivors,
        "survivor_heartbeats": timeline,
    }


def _reprefill(row: dict[str, Any]) -> int:
    """A taken-over job's tokens to prefill again: its prompt and its tokens so far."""
    return int(row["prompt_tokens"] or 0) + int(row["tokens_before_kill"])


def pause_bound(breakdown: dict[str, Any], rec: dict[str, Any], lease_ttl: float,
                watchdog_interval: float) -> dict[str, Any]:
    """The longest pause of a taken-over stream, its timeline, and the bound it is held
    to: lease + detection + re-prefill tokens / the survivors' summed prefill rates."""
    rates = [s["prefill_tokens_per_s"] or 0.0 for s in rec["survivors"].values()]
    reprefill_s = rec["reprefill_tokens"] / sum(rates) if sum(rates) > 0 else None
    paused = [row for row in breakdown["streams"] if row["pause_s"] is not None]
    longest = max(paused, key=lambda row: row["pause_s"], default=None)
    bound = None if reprefill_s is None else lease_ttl + watchdog_interval + reprefill_s
    phases = {}
    if longest is not None:
        points = ["last_token", "kill", "lease_expiry", "detected", "claimed", "first_token"]
        at = {name: (0.0 if name == "kill" else longest[name]) for name in points}
        known = [name for name in points if at[name] is not None]
        phases = {f"{a}_to_{b}": round(at[b] - at[a], 3) for a, b in itertools.pairwise(known)}
    return {
        "lease_s": lease_ttl, "detection_s": watchdog_interval,
        "reprefill_tokens": rec["reprefill_tokens"], "survivors": len(rates),
        "summed_prefill_tokens_per_s": round(sum(rates), 1),
        "reprefill_s": None if reprefill_s is None else round(reprefill_s, 3),
        "bound_s": None if bound is None else round(bound, 3),
        "longest_pause_s": None if longest is None else longest["pause_s"],
        "longest_pause_stream": None if longest is None else longest["stream"],
        "longest_pause_claimed_by": None if longest is None else longest["claimed_by"],
        "longest_pause_phases_s": phases,
        "within": None if bound is None or longest is None else longest["pause_s"] <= bound,
    }


def job_records(url: str, job_ids: list[str]) -> dict[str, int]:
    """How many taken-over jobs' records say lost=1, attempts=2 (one death, one takeover)."""
    import redis

    from kvrelay.keys import Keyspace

    keys = Keyspace()
    client = redis.Redis.from_url(url)
    try:
        seen: Counter[str] = Counter()
        for job_id in job_ids:
            lost, attempts = client.hmget(keys.job_record(job_id), "lost", "attempts")
            seen[f"lost={int(lost or 0)},attempts={int(attempts or 0)}"] += 1
        return dict(seen)
    finally:
        client.close()


def print_report(report: dict[str, Any]) -> None:
    ref, run, acc = report["reference"], report["takeover"], report["acceptance"]
    print(f"reference: {ref['completed']}/{ref['streams']} complete, longest pause "
          f"{ref['longest_pause_s']} s, {ref['output_tok_s']} tok/s")
    print(f"takeover: {run['completed']}/{run['streams']} complete, "
          f"{run['token_identical']} token-identical, longest pause {run['longest_pause_s']} s "
          f"(limit {acc['limit_s']} s: {'holds' if acc['holds'] else 'FAILS'})")
    kill = report["kill"]
    print(f"killed {kill['victim']} at {kill['at_s']} s (median {kill['median_tokens']} "
          f"tokens), {kill['taken_over']} jobs taken over; records {kill['job_records']}")
    print(f"{'phase (s)':<28} {'p50':>8} {'p90':>8} {'max':>8}")
    for name, value in report["breakdown"]["phases_s"].items():
        if value is not None:
            print(f"{name:<28} {value['p50']:>8.3f} {value['p90']:>8.3f} {value['max']:>8.3f}")
    rec = report["recovery"]
    print(f"survivors' own streams, longest pause after the kill: "
          f"{rec['survivor_longest_pause_after_kill']}; re-prefilled {rec['reprefill_tokens']} "
          f"tokens at {rec['reprefill_tokens_per_s']} tok/s")
    for name, survivor in rec["survivors"].items():
        print(f"survivor {name}: {survivor['taken_over']} jobs taken over, "
              f"{survivor['reprefill_tokens']} tokens re-prefilled, measured prefill rate "
              f"{survivor['prefill_tokens_per_s']} tok/s")
    bound = report["bound"]
    print(f"longest taken-over pause {bound['longest_pause_s']} s (stream "
          f"{bound['longest_pause_stream']}, {bound['longest_pause_phases_s']}); bound "
          f"{bound['lease_s']} + {bound['detection_s']} + {bound['reprefill_tokens']} / "
          f"{bound['summed_prefill_tokens_per_s']} = {bound['bound_s']} s: "
          f"{'within' if bound['within'] else 'NOT within'}")
    print(f"load average {report['load_average']}")


