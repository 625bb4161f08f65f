"""Supply-chain audit of the pinned requirements, run by `make test` (and so by CI).

pip-audit looks every pinned package up in PyPI's advisory data. A known vulnerability
that has a fixed release fails the run; one with no fix yet is printed, since there is
nothing to upgrade to. Where the advisory data cannot be reached (a mirror that serves
only package files answers "not found" for every package), the audit says loudly that it
did not happen instead of passing as clean; AUDIT_REQUIRED=true makes that a failure too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REQUIREMENTS = ("requirements.txt", "requirements-test.txt")


def audit(requirements: str) -> dict:
    completed = subprocess.run(
        [sys.executable, "-m", "pip_audit", "-r", requirements, "--no-deps", "--disable-pip", "--progress-spinner", "off", "-f", "json", "-s", "pypi"],
        capture_output=True, text=True, timeout=600,
    )
    try:
        return json.loads(completed.stdout)
    except json.JSONDecodeError:
        return {"error": (completed.stderr or completed.stdout).strip()[-400:]}


def main() -> int:
    required = os.environ.get("AUDIT_REQUIRED", "").lower() in {"1", "true", "yes"}
    failed = unreachable = False
    for requirements in REQUIREMENTS:
        report = audit(requirements)
        if "error" in report:
            print(f"audit: pip-audit failed on {requirements}: {report['error']}")
            unreachable = True
            continue
        dependencies = report.get("dependencies", [])
        audited = [d for d in dependencies if "skip_reason" not in d]
        if dependencies and not audited:
            print(f"audit: NOT PERFORMED for {requirements}: the advisory data was unreachable ({len(dependencies)} packages unaudited)")
            unreachable = True
            continue
        for dependency in audited:
            for vulnerability in dependency.get("vulns", []):
                fixes = ", ".join(vulnerability.get("fix_versions", [])) or "none yet"
                print(f"audit: {dependency['name']} {dependency['version']}: {vulnerability['id']} (fixed in: {fixes})")
                failed = failed or bool(vulnerability.get("fix_versions"))
        print(f"audit: {requirements}: {len(audited)} packages audited")
    if failed:
        print("audit: a pinned package has a known vulnerability with a fix: upgrade it")
        return 1
    return 1 if unreachable and required else 0


if __name__ == "__main__":
    sys.exit(main())
