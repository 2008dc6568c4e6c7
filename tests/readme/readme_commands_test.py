#!/usr/bin/env python3
"""readme_commands: runs the shell commands of README.md in order, as written, from an empty directory.

Usage: readme_commands_test.py SOURCE_DIR BUILD_DIR [--list]

The commands are the lines of README.md's code blocks that start with a path the README's commands
start with (build/, scripts/, .venv/, cmake, ...; `\\` continuations joined): the indented blocks and
the fenced blocks without a language (```cpp and ```python blocks are code, not commands; the C++
example is the api_readme_example test). A block whose first line is a command must hold commands
only, so a README that turns a command into something else fails here instead of being skipped.

They run one by one under `bash -o pipefail` in a fresh temporary directory that holds nothing but
links to what the README's relative paths name in a checkout: build (BUILD_DIR), sample_models,
scripts, schemas, examples and .venv. Every file a command writes (plan.json, out/..., ckpt/...)
lands in that directory, so a command that needs an earlier one's output fails if the README stops
making it first. Each must exit 0, except `apc diff`, whose documented exit status 1 means "the
placements differ". SKIPPED below lists what does not run here and why; --list prints every
command with its verdict.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

# The first word of a command line. A line of a code block starting otherwise is not a command.
COMMAND_START = re.compile(r"^(build/|build-trainer/|scripts/|\.venv/|cmake |ctest )")

# (pattern on the whole command, why it does not run here). Keep this list short: each entry is
# a README command this test does not check.
SKIPPED = [
    (r"^scripts/(demo|test)\.sh\b",
     "the whole setup, build and test run: scripts/test.sh runs this very test (CI runs both)"),
    (r"^scripts/bench_\w+\.sh\b",
     "benchmarks of many models and plans, minutes each (not a check)"),
    (r"^cmake --install build --prefix /opt/apc\b",
     "installs outside the tree; the install_example test installs into a temporary prefix and "
     "runs these steps"),
    (r"build-trainer\b",
     "the trainer built against the /opt/apc install above (install_example runs it)"),
]

# Needs a program the CI image may not have: skipped only where it is absent.
NEEDS = [(r"\|\s*dot\b", "dot", "Graphviz's dot is not installed")]

# Extra seconds a command may take (everything else: PER_COMMAND_S).
PER_COMMAND_S = 120


def commands(readme_text):
    """[(line number, command)] in README order."""
    out = []
    lines = readme_text.split("\n")
    i = 0
    fenced = False
    fence_lang = ""
    block = []  # (line number, text) of the current block

    def flush():
        if not block:
            return
        first = block[0][1]
        if not COMMAND_START.match(first):
            block.clear()
            return
        joined = []
        for number, text in block:
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1].rstrip() + " " + text.strip())
            elif text.strip():
                joined.append((number, text.strip()))
        for number, text in joined:
            if not COMMAND_START.match(text):
                raise SystemExit(f"README.md:{number}: a command block holds a line that is not "
                                 f"a command: {text!r}")
            out.append((number, text))
        block.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            if not fenced:
                fenced, fence_lang = True, line[3:].strip()
            else:
                if fence_lang in ("", "sh", "bash", "shell"):
                    flush()
                block.clear()
                fenced = False
        elif fenced:
            if fence_lang in ("", "sh", "bash", "shell"):
                block.append((i + 1, line))
        elif line.startswith("    ") and (block or not lines[i - 1].strip()):
            block.append((i + 1, line[4:]))
        else:
            flush()
        i += 1
    flush()
    return out


def verdict(cmd):
    for pattern, why in SKIPPED:
        if re.search(pattern, cmd):
            return why
    for pattern, program, why in NEEDS:
        if re.search(pattern, cmd) and subprocess.run(["sh", "-c", f"command -v {program}"],
                                                      capture_output=True).returncode != 0:
            return why
    return None


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    source, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with open(os.path.join(source, "README.md")) as f:
        cmds = commands(f.read())
    if not cmds:
        print("README.md: no commands found")
        return 1
    if "--list" in sys.argv:
        for number, cmd in cmds:
            why = verdict(cmd)
            print(f"README.md:{number}: {'SKIP (' + why + ') ' if why else ''}{cmd}")
        return 0
    work = tempfile.mkdtemp(prefix="apc_readme_")
    links = {"build": build}
    for name in ("sample_models", "scripts", "schemas", "examples", ".venv"):
        links[name] = os.path.join(source, name)
    for name, target in links.items():
        os.symlink(target, os.path.join(work, name))
    print(f"running {len(cmds)} README commands in {work}", flush=True)
    failures, ran, skipped = [], 0, 0
    start = time.monotonic()
    for number, cmd in cmds:
        why = verdict(cmd)
        if why:
            skipped += 1
            print(f"README.md:{number}: skipped ({why}): {cmd}", flush=True)
            continue
        t0 = time.monotonic()
        try:
            r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=work,
                               capture_output=True, text=True, timeout=PER_COMMAND_S)
            rc, out = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            rc, out = "timeout", f"ran over {PER_COMMAND_S} s"
        ran += 1
        ok = rc == 0 or (rc == 1 and re.match(r"^build/tools/apc diff\b", cmd))
        print(f"README.md:{number}: rc {rc} in {time.monotonic() - t0:.1f} s: {cmd}", flush=True)
        if not ok:
            failures.append(number)
            print("  " + "\n  ".join(out.strip().split("\n")[-15:]), flush=True)
    print(f"{ran} ran, {skipped} skipped, {len(failures)} failed in "
          f"{time.monotonic() - start:.1f} s" +
          (": README.md lines " + ", ".join(map(str, failures)) if failures else ""))
    if not failures:
        subprocess.run(["rm", "-rf", work])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
