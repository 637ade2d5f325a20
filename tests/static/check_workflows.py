#!/usr/bin/env python3
"""Static checks for the GitHub Actions workflows in .github/workflows/.

Checks, without GitHub or network access:
  * every workflow parses, has a trigger and jobs; every step has `uses` or `run`;
    every `needs` names a job of the same workflow;
  * every repository file a step refers to exists: scripts run by `run` steps
    (scripts/, packaging/, tests/, .ci/, docker/, config/), local actions, and the
    Dockerfile and context of docker/build-push-action;
  * ci.yml runs `.ci/run`;
  * release.yml runs on `v*` tags; builds the x86_64 and aarch64 musl targets with the
    `static` feature (declared in Cargo.toml); writes SHA256SUMS; builds the Debian
    package with packaging/deb/build.sh; creates a GitHub release; and pushes the image to
    ghcr.io for linux/amd64 and linux/arm64 with docker/build-push-action.

Usage: check_workflows.py   (prints "workflows: ok", or the problems and exits 1)

Needs PyYAML.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml  # type: ignore[import-untyped]

from report import verdict

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = Path(".github/workflows")
# Paths in `run` scripts that must exist in the repository.
PATH_RE = re.compile(r"(?<![\w./-])((?:\.ci|scripts|packaging|tests|docker|config)/[\w./-]*[\w-])")
MUSL_TARGETS = ("x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl")
PLATFORMS = {"linux/amd64", "linux/arm64"}


class Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, msg: str) -> None:
        self.errors.append(msg)

    def load(self, rel: Path) -> dict | None:
        try:
            data = yaml.safe_load((ROOT / rel).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            self.fail(f"{rel}: {err}")
            return None
        if not isinstance(data, dict):
            self.fail(f"{rel}: expected a mapping")
            return None
        # YAML 1.1 reads the key `on` as the boolean true.
        if True in data and "on" not in data:
            data["on"] = data.pop(True)
        return data

    def steps(self, workflow: dict):
        for job_name, job in (workflow.get("jobs") or {}).items():
            for step in (job or {}).get("steps") or []:
                yield job_name, step

    def check_workflow(self, rel: Path, workflow: dict) -> None:
        if not workflow.get("on"):
            self.fail(f"{rel}: no trigger (`on`)")
        jobs = workflow.get("jobs")
        if not isinstance(jobs, dict) or not jobs:
            self.fail(f"{rel}: no jobs")
            return
        for name, job in jobs.items():
            if not isinstance(job, dict) or "runs-on" not in job:
                self.fail(f"{rel}: job {name}: needs runs-on")
                continue
            needs = job.get("needs") or []
            for need in [needs] if isinstance(needs, str) else needs:
                if need not in jobs:
                    self.fail(f"{rel}: job {name}: needs unknown job {need!r}")
            if not job.get("steps"):
                self.fail(f"{rel}: job {name}: no steps")
        for job, step in self.steps(workflow):
            where = f"{rel}: job {job}: step {step.get('name') or step.get('uses') or '?'}"
            if ("uses" in step) == ("run" in step):
                self.fail(f"{where}: needs exactly one of uses and run")
                continue
            if "run" in step:
                for path in PATH_RE.findall(str(step["run"])):
                    if not (ROOT / path).exists():
                        self.fail(f"{where}: runs {path}, which does not exist")
            uses = str(step.get("uses", ""))
            if uses.startswith("./") and not (ROOT / uses).exists():
                self.fail(f"{where}: local action {uses} does not exist")
            if uses and not uses.startswith("./") and "@" not in uses:
                self.fail(f"{where}: action {uses} is not pinned to a version")
            if uses.startswith("docker/build-push-action@"):
                with_ = step.get("with") or {}
                context = ROOT / str(with_.get("context", "."))
                if not context.is_dir():
                    self.fail(f"{where}: context {with_.get('context')} does not exist")
                dockerfile = with_.get("file")
                if dockerfile and not (context / str(dockerfile)).is_file():
                    self.fail(f"{where}: file {dockerfile} does not exist")

    def runs(self, workflow: dict) -> str:
        return "\n".join(str(step.get("run", "")) for _, step in self.steps(workflow))

    def check_ci(self, rel: Path, workflow: dict) -> None:
        if ".ci/run" not in self.runs(workflow):
            self.fail(f"{rel}: does not run .ci/run")

    def check_release(self, rel: Path, workflow: dict) -> None:
        on = workflow.get("on") or {}
        tags = ((on.get("push") or {}) if isinstance(on, dict) else {}).get("tags") or []
        if "v*" not in tags:
            self.fail(f"{rel}: does not run on tags v*")
        text = (ROOT / rel).read_text(encoding="utf-8")
        for target in MUSL_TARGETS:
            if target not in text:
                self.fail(f"{rel}: does not build {target}")
        runs = self.runs(workflow)
        if "--features static" not in runs:
            self.fail(f"{rel}: the binaries are not built with the `static` feature")
        cargo = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
        if not re.search(r"(?m)^static\s*=", cargo):
            self.fail(f"{rel}: Cargo.toml declares no `static` feature")
        if "SHA256SUMS" not in runs:
            self.fail(f"{rel}: writes no SHA256SUMS")
        if "packaging/deb/build.sh" not in runs:
            self.fail(f"{rel}: does not build the Debian package with packaging/deb/build.sh")
        if "gh release create" not in runs and not any(
            str(s.get("uses", "")).startswith("softprops/action-gh-release@") for _, s in self.steps(workflow)
        ):
            self.fail(f"{rel}: creates no GitHub release")
        pushes = [s for _, s in self.steps(workflow)
                  if str(s.get("uses", "")).startswith("docker/build-push-action@")]
        if not pushes:
            self.fail(f"{rel}: does not use docker/build-push-action")
        for step in pushes:
            with_ = step.get("with") or {}
            platforms = {p.strip() for p in str(with_.get("platforms", "")).split(",")}
            if not PLATFORMS <= platforms:
                self.fail(f"{rel}: build-push-action builds {sorted(platforms)}, not {sorted(PLATFORMS)}")
            if str(with_.get("push")).lower() != "true":
                self.fail(f"{rel}: build-push-action does not push")
        if "ghcr.io" not in text:
            self.fail(f"{rel}: pushes nothing to ghcr.io")


def main() -> int:
    checker = Checker()
    found = sorted((ROOT / WORKFLOWS).glob("*.yml")) + sorted((ROOT / WORKFLOWS).glob("*.yaml"))
    names = {p.name for p in found}
    for needed in ("ci.yml", "release.yml"):
        if needed not in names:
            checker.fail(f"{WORKFLOWS / needed}: missing")
    for path in found:
        rel = path.relative_to(ROOT)
        workflow = checker.load(rel)
        if workflow is None:
            continue
        checker.check_workflow(rel, workflow)
        if path.name == "ci.yml":
            checker.check_ci(rel, workflow)
        if path.name == "release.yml":
            checker.check_release(rel, workflow)
    return verdict("workflows", checker.errors)


if __name__ == "__main__":
    sys.exit(main())
