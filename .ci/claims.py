"""What pyproject.toml claims, for .ci/run.

``pythons``: the lowest Python the package claims (requires-python's floor) and the
newest (the highest ``Programming Language :: Python :: 3.N`` classifier), on one line.
``lowest-pins``: a pip constraints file holding each runtime dependency (and the
``postgres`` extra's) at the lower bound of its pin.
"""

import re
import sys
import tomllib
from pathlib import Path

PROJECT = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]


def pythons() -> str:
    floor = re.fullmatch(r">=\s*(3\.\d+)", PROJECT["requires-python"])
    if floor is None:
        raise SystemExit(f"requires-python is not '>=3.N': {PROJECT['requires-python']!r}")
    listed = [
        c.rsplit(" ", 1)[1]
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    if not listed:
        raise SystemExit("no 'Programming Language :: Python :: 3.N' classifier")
    newest = max(listed, key=lambda v: int(v.split(".")[1]))
    return f"{floor.group(1)} {newest}"


def lowest_pins() -> str:
    pins = []
    for req in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["postgres"]:
        found = re.fullmatch(r"([\w.-]+)(?:\[[\w,-]+\])?>=([\w.]+)(?:,.*)?", req)
        if found is None:
            raise SystemExit(f"a runtime dependency without a lower bound: {req!r}")
        pins.append(f"{found.group(1)}=={found.group(2)}\n")
    return "".join(pins)


if __name__ == "__main__":
    print({"pythons": pythons, "lowest-pins": lowest_pins}[sys.argv[1]]().rstrip("\n"))
