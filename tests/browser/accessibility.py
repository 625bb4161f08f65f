"""The browser suite's accessibility check: axe-core, vendored (tests run offline), run
in the page under test. A page passes with no violation of impact "serious" or
"critical"; every violation found (of any impact) is written to
test-artifacts/axe-<name>.json beside a screenshot, audit-axe-<name>.png, so a failure
says which rule, which element and why without rerunning.

Use it on any page: ``assert_no_serious_violations(page, "models")``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser.conftest import ARTIFACTS

AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
FAILING_IMPACTS = ("serious", "critical")
# WCAG 2.1 A and AA, plus axe's best practices (landmarks, one main, page headings).
RUN_OPTIONS = {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]}, "resultTypes": ["violations"]}


def violations(page) -> list[dict]:
    """axe-core's violations on the page as it is now."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        # Not page.add_script_tag: the console's Content-Security-Policy (script-src 'self')
        # refuses an inline script, as it should. Playwright's evaluate runs outside the
        # page's CSP, which stays in force for everything else; ";true" keeps the script's
        # completion value from being a function Playwright would call.
        page.evaluate(AXE.read_text(encoding="utf-8") + "\n;true")
    return page.evaluate("options => axe.run(document, options).then(results => results.violations)", RUN_OPTIONS)


def assert_no_serious_violations(page, name: str) -> list[dict]:
    """Fails on any serious or critical violation; returns every violation found."""
    found = violations(page)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"axe-{name}.json").write_text(json.dumps({"url": page.url, "violations": found}, indent=2))
    page.screenshot(path=str(ARTIFACTS / f"audit-axe-{name}.png"), full_page=True)
    serious = [violation for violation in found if violation.get("impact") in FAILING_IMPACTS]
    assert not serious, f"{name} ({page.url}): {len(serious)} serious accessibility violations:\n" + "\n".join(map(describe, serious))
    return found


def describe(violation: dict) -> str:
    targets = "; ".join(" ".join(map(str, node["target"])) for node in violation["nodes"][:5])
    return f"- [{violation['impact']}] {violation['id']}: {violation['help']} ({len(violation['nodes'])} elements: {targets})"
