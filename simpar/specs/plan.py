"""Plan: the self-contained, versioned JSON document that `simpar plan` writes and execpar runs.

It carries the resolved model, cluster, job and strategy (so a run never depends on
simpar's catalogs at run time) and the prediction it was chosen by, for `simpar
validate` to compare against."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from simpar.errors import SpecError, require
from simpar.files import read_text, write_json
from simpar.specs.cluster import ClusterSpec
from simpar.specs.job import JobSpec
from simpar.specs.model import ModelSpec
from simpar.specs.strategy import Strategy, validate

SCHEMA = "simpar-plan"
VERSION = 1


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    strategy: Strategy
    prediction: dict

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "version": VERSION, "model": self.model.to_dict(),
            "cluster": self.cluster.to_dict(),
            "job": {f.name: getattr(self.job, f.name)
                    for f in fields(self.job)}, "strategy": self.strategy.to_dict(),
            "prediction": self.prediction
        }

    def write(self, path: str) -> None:
        """Write atomically: a temporary file in the same folder, then rename."""
        write_json(path, self.to_dict(), "out")


def load_plan(path: str) -> Plan:
    p = Path(path)
    text = read_text(p, "plan", "no such file; write one with `simpar plan ... --out plan.json`")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError("plan", str(path),
                        f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting 10^5 deep
        raise SpecError("plan", str(path),
                        f"is not a plan simpar wrote ({exc}"[:150] + ")") from None

    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise SpecError("plan.schema", data.get("schema") if isinstance(data, dict) else None,
                        f"is not a simpar plan; write one with `simpar plan ... --out {p.name}`")
    if data.get("version") != VERSION:
        raise SpecError(
            "plan.version", data.get("version"),
            f"this simpar reads plan version {VERSION}; re-create the plan with this version's "
            "`simpar plan`")
    for key in ("model", "cluster", "job", "strategy"):
        require(isinstance(data.get(key), dict), f"plan.{key}", data.get(key),
                "must be a mapping; re-create the plan with `simpar plan`")
    try:
        model = ModelSpec.from_dict(data["model"], "plan.model")
        cluster = ClusterSpec.from_dict(data["cluster"], "plan.cluster")
        job = JobSpec(**data["job"])
        strategy = Strategy(**data["strategy"])
    except KeyError as exc:
        raise SpecError(f"plan.{exc.args[0]}", None,
                        "is missing; re-create the plan with `simpar plan`") from None
    except TypeError as exc:
        raise SpecError("plan", str(path),
                        f"has unexpected fields ({exc}); re-create it with `simpar plan`") from None
    validate(strategy, model, job, strategy.gpus)
    prediction = data.get("prediction", {})
    require(isinstance(prediction, dict), "plan.prediction", prediction,
            "must be a mapping; re-create the plan with `simpar plan`")
    return Plan(model, cluster, job, strategy, prediction)
