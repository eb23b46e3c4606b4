"""The comparison's last stage: what a reader sees. In: results.json's content (table.results). Out:
curves.png, one panel per curve (held-out accuracy, wrong-completion length, entropy, clipped-token share)
with one line per variant, its seeds' mean, in a band from their lowest to their highest (matplotlib, the
`plot` extra; without it, no picture and the page says so), and report.html, one page with the table, the
fits, the curves as an embedded PNG and each variant's flags: no script, no network. It knows results, not
how they were made.
"""

from __future__ import annotations

import base64
import html
import io
import os

from ..files import replaced_whole
from .table import COLUMNS, CURVES, FIT_HEADERS, cell, fit_cells


def band(runs: dict[str, dict], curve: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps every finished seed logged `curve` at, and the seeds' mean, lowest and highest there."""
    series = [
        dict((step, value) for step, value in run["curves"][curve])
        for run in runs.values()
        if "curves" in run
    ]
    if not series:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(s) for s in series)))
    mean = [sum(s[step] for s in series) / len(series) for step in steps]
    low = [min(s[step] for s in series) for step in steps]
    high = [max(s[step] for s in series) for step in steps]
    return steps, mean, low, high


def curves_png(found: dict) -> bytes | None:
    """The curves as PNG bytes; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(CURVES.values())
    # one look per variant: ten colours, then the same colours dashed, then dotted
    looks = {
        variant: dict(color=plt.cm.tab10(i % 10), linestyle=("-", "--", ":")[i // 10 % 3])
        for i, variant in enumerate(found["runs"])
    }
    figure, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names) + 1.8, 3.6))
    for ax, curve in zip(axes, names):
        for variant, runs in found["runs"].items():
            steps, mean, low, high = band(runs, curve)
            if steps:
                ax.plot(steps, mean, label=variant, linewidth=1.2, **looks[variant])
                ax.fill_between(steps, low, high, color=looks[variant]["color"], alpha=0.12, linewidth=0)
        ax.set_title(curve)
        ax.set_xlabel("step")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # no finished run, no line
        figure.legend(handles, labels, loc="center right", fontsize=8)
    figure.tight_layout(rect=(0, 0, 1 - 1.8 / (4.5 * len(names) + 1.8), 1))
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:110em}table{border-collapse:collapse;margin:.6em 0}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}td:first-child,th:first-child"
    "{text-align:left}code{font-size:.9em}img{max-width:100%}"
)


def render_html(found: dict, png: bytes | None) -> str:
    """report.html: the table with its mark, the fits, the curves and each variant's flags."""
    e = html.escape
    header = "".join(f"<th>{e(title)}</th>" for title, _, _ in COLUMNS)
    rows = "".join(
        f"<tr><td>{e(name)}</td>"
        + "".join(f"<td>{e(cell(row, key, form))}</td>" for _, key, form in COLUMNS)
        + "</tr>"
        for name, row in found["rows"].items()
    )
    fits = "".join(
        f"<tr><td>{e(name)}</td>" + "".join(f"<td>{e(value)}</td>" for value in fit_cells(row)) + "</tr>"
        for name, row in found["rows"].items()
    )
    flags = "".join(
        f"<tr><td>{e(name)}</td><td><code>{e(' '.join(words) or '(the default job)')}</code></td></tr>"
        for name, words in found["plan"]["variants"].items()
    )
    failed = "".join(
        f"<li>{e(name)} seed {e(seed)}: {e(error)}</li>"
        for name, row in found["rows"].items()
        for seed, error in row["failed"].items()
    )
    picture = (
        f"<img alt='curves' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        if png
        else "<p>No curves: matplotlib is not installed (pip install -e '.[plot]').</p>"
    )
    plan = found["plan"]
    return "".join(
        [
            "<!doctype html><html><head><meta charset='utf-8'><title>minigrpo: objectives compared</title>",
            f"<style>{STYLE}</style></head><body><h1>Objectives compared</h1>",
            f"<p>{len(plan['variants'])} variants × seeds {e(', '.join(map(str, plan['seeds'])))}; budget "
            f"<code>{e(str(plan['budget']))}</code>; flags of every run: "
            f"<code>{e(' '.join(plan['common']) or '-')}</code></p>",
            f"<table><tr><th>variant</th>{header}</tr>{rows}</table>",
            f"<p>Intervals: {e(found['intervals'])}. Mark: {e(found['mark'])}.</p>",
            "<h2>ScaleRL's fit: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)</h2>",
            "<table><tr><th>variant</th>" + "".join(f"<th>{e(h)}</th>" for h in FIT_HEADERS),
            f"</tr>{fits}</table>",
            f"<h2>Curves (mean over seeds, band from lowest to highest)</h2>{picture}",
            f"<h2>Each variant's flags</h2><table>{flags}</table>",
            f"<h2>Runs that failed or have not run</h2><ul>{failed}</ul>" if failed else "",
            "</body></html>",
        ]
    )


def write_report(out: str, found: dict) -> bool:
    """curves.png (with matplotlib) and report.html into `out`; whether the curves were drawn."""
    png = curves_png(found)
    if png is not None:
        with open(os.path.join(out, "curves.png.tmp"), "wb") as f:
            f.write(png)
        os.replace(os.path.join(out, "curves.png.tmp"), os.path.join(out, "curves.png"))
    with replaced_whole(os.path.join(out, "report.html")) as f:
        f.write(render_html(found, png))
    return png is not None
