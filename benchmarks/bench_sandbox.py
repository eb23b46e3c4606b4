"""The code sandbox against a directory of escape payloads, each with its expected containment verdict.

The suite is rustbox-escape-tests (github.com/orkait/rustbox-escape-tests): `manifest.json` lists each
payload's file, language and expected verdict (`verdict`, `verdict_any`, `verdict_not`,
`stdout_contains`, `exit_code`, as its run.sh checks them). Its Python payloads run here, one at a time,
as stdin/stdout tests through `run_cases` (code.py) with the default SandboxConfig, and each outcome is
mapped to the suite's verdicts: TLE (killed at the timeout), MLE (MemoryError), SIG (killed by a signal),
IE (the sandbox could not confine the test), AC (exit 0) and RE (any other failure). A payload is
contained when its verdict meets the manifest's expectation. Payloads in other languages are counted,
not run. The suite is its authors' code: get it yourself, outside the repository (benchmarks/README.md).

    python benchmarks/bench_sandbox.py --suite /tmp/rustbox
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line  # noqa: E402

from minigrpo.verifier import CaseResult, SandboxConfig, run_cases  # noqa: E402

SANDBOX_EXIT = 125  # confine.py's exit status when it could not confine the test (the program never ran)
NON_GOALS = {  # payload file: why it is not contained, by design (README, "What is guaranteed")
    "python/escape_chroot.py": (
        "reads /etc/passwd through '..': world-readable files are readable (no chroot)"
    ),
    "python/read_etc_passwd.py": "world-readable files are readable (no chroot)",
    "python/read_proc_cpuinfo.py": "/proc is the host's (it shows CPU and memory, not secrets)",
    "python/read_proc_meminfo.py": "/proc is the host's (it shows CPU and memory, not secrets)",
    "python/read_sys_hardware.py": "/sys is the host's, read-only",
}


def verdict(result: CaseResult) -> str:
    """The suite's verdict for one run of a payload."""
    if result.timed_out:
        return "TLE"
    if result.exit_code < 0:
        return "SIG"
    if result.exit_code == 0:
        return "AC"
    if result.exit_code == SANDBOX_EXIT:
        return "IE"
    return "MLE" if "MemoryError" in result.stderr else "RE"


def meets(expect: dict, got: str, result: CaseResult) -> bool:
    """Whether a verdict and its run meet a manifest entry's `expect`, as the suite's run.sh checks it."""
    checks = [
        expect.get("verdict", got) == got,
        got in expect.get("verdict_any", [got]),
        expect.get("verdict_not") != got,
        expect.get("stdout_contains", "") in result.stdout,
        int(expect.get("exit_code", result.exit_code)) == result.exit_code,
    ]
    return all(checks)


def run_payload(suite: str, test: dict, config: SandboxConfig) -> tuple[str, bool]:
    with open(os.path.join(suite, "payloads", test["file"]), encoding="utf-8") as file:
        program = file.read()
    result = run_cases(program, [{"input": "", "output": ""}], config)[0]
    got = verdict(result)
    return got, meets(test["expect"], got, result)


def expected(expect: dict) -> str:
    if "verdict" in expect:
        return expect["verdict"]
    if "verdict_any" in expect:
        return "any of " + ",".join(expect["verdict_any"])
    return " ".join(f"{key}={value}" for key, value in expect.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--suite", required=True, help="a checkout of rustbox-escape-tests (manifest.json, payloads/)"
    )
    parser.add_argument("--workers", type=int, default=4, help="payloads run at once")
    args = parser.parse_args()
    manifest = os.path.join(args.suite, "manifest.json")
    if not os.path.isfile(manifest):
        sys.exit(
            f"bench_sandbox: no manifest.json in {args.suite}; "
            "see benchmarks/README.md for how to get the suite"
        )
    with open(manifest, encoding="utf-8") as file:
        tests = json.load(file)["tests"]
    python = [test for test in tests if test["language"] == "python"]
    print(machine_line())
    print(
        f"{len(python)} Python payloads run, {len(tests) - len(python)} in other languages not run; "
        f"root: {os.geteuid() == 0}\n"
    )
    config = SandboxConfig()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        outcomes = list(pool.map(lambda test: run_payload(args.suite, test, config), python))
    print("| payload | expected | got | contained? | why not (a non-goal) |")
    print("|---|---|---|---|---|")
    for test, (got, contained) in zip(python, outcomes):
        why = "" if contained else NON_GOALS.get(test["file"], "**not a documented non-goal**")
        print(
            f"| {test['name']} | {expected(test['expect'])} | {got} | "
            f"{'yes' if contained else 'NO'} | {why} |"
        )
    missed = [test for test, (_, contained) in zip(python, outcomes) if not contained]
    documented = sum(test["file"] in NON_GOALS for test in missed)
    print(
        f"\n{len(python) - len(missed)} / {len(python)} contained; of the {len(missed)} not contained, "
        f"{documented} are documented non-goals and {len(missed) - documented} are not"
    )


if __name__ == "__main__":
    main()
