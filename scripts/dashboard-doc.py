#!/usr/bin/env python3
"""The README's list of the chart's Grafana panels and alerts, made from the files
themselves so that it stays true: charts/dra-scheduler/dashboards/dra-scheduler.json and
charts/dra-scheduler/rules/dra-scheduler.rules.yaml.

    scripts/dashboard-doc.py                    print the list (markdown)
    scripts/dashboard-doc.py --update README.md  replace the list between the markers
                                                 <!-- dashboard-doc begin/end --> there

tests/observability.rs checks that the README holds exactly what this prints.
"""
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "dra-scheduler"
DASHBOARD = CHART / "dashboards" / "dra-scheduler.json"
RULES = CHART / "rules" / "dra-scheduler.rules.yaml"
BEGIN = "<!-- dashboard-doc begin: scripts/dashboard-doc.py --update README.md -->"
END = "<!-- dashboard-doc end -->"


def cell(text):
    """One markdown table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def panels(dashboard):
    """(row, title, description) of every panel, in the dashboard's order."""
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            # A collapsed row keeps its panels inside it.
            for inner in panel.get("panels", []):
                yield row, inner["title"], inner.get("description", "")
        else:
            yield row, panel["title"], panel.get("description", "")


def alerts(rules):
    """(name, severity, for, summary) of every alerting rule."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                yield (
                    rule["alert"],
                    rule.get("labels", {}).get("severity", ""),
                    rule.get("for", "0s"),
                    rule.get("annotations", {}).get("summary", ""),
                )


def markdown():
    dashboard = json.loads(DASHBOARD.read_text())
    rules = yaml.safe_load(RULES.read_text())
    variables = ", ".join(
        v.get("label") or v["name"] for v in dashboard["templating"]["list"]
    )
    out = [
        f"Dashboard \"{dashboard['title']}\" (variables: {variables}):",
        "",
        "| row | panel | what it shows |",
        "| --- | --- | --- |",
    ]
    out += [f"| {cell(r)} | {cell(t)} | {cell(d)} |" for r, t, d in panels(dashboard)]
    out += [
        "",
        "Alerts:",
        "",
        "| alert | severity | for | when |",
        "| --- | --- | --- | --- |",
    ]
    out += [
        f"| `{cell(a)}` | {cell(s)} | {cell(f)} | {cell(w)} |" for a, s, f, w in alerts(rules)
    ]
    return "\n".join(out) + "\n"


def update(path):
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        sys.exit(f"{path}: no {BEGIN} ... {END} block")
    start += len(BEGIN)
    path.write_text(text[:start] + "\n" + markdown() + text[end:])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--update"] and len(sys.argv) == 3:
        update(pathlib.Path(sys.argv[2]))
    elif len(sys.argv) == 1:
        sys.stdout.write(markdown())
    else:
        sys.exit(__doc__)
