#!/usr/bin/python3
"""tests/plan/check_plan_schema.py - plan files against schemas/plan.schema.json.

Usage: check_plan_schema.py PLAN.json...  (run from anywhere; paths are taken as given).
Checks that schemas/plan.schema.json is a valid draft-07 schema, that every plan is valid against it,
and that each plan's embedded spec is valid against schemas/spec.schema.json. Exit 0 when all are
valid, 1 on a violation (printed one per line), 77 when the system python lacks jsonschema (Debian's
python3-jsonschema), which plan_test reports as a skip.
"""
import json
import os
import sys

try:
    import jsonschema
except ImportError:
    print("jsonschema is not installed (apt-get install python3-jsonschema)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(path):
    with open(path) as f:
        return json.load(f)


def main(paths):
    plan_schema = load(os.path.join(ROOT, "schemas", "plan.schema.json"))
    spec_schema = load(os.path.join(ROOT, "schemas", "spec.schema.json"))
    failures = []
    try:
        jsonschema.Draft7Validator.check_schema(plan_schema)
    except jsonschema.SchemaError as e:
        print(f"plan schema is not a valid draft-07 schema: {e.message}")
        return 1
    plan_v = jsonschema.Draft7Validator(plan_schema)
    spec_v = jsonschema.Draft7Validator(spec_schema)
    for path in paths:
        doc = load(path)
        for e in plan_v.iter_errors(doc):
            failures.append(f"{path}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
        for e in spec_v.iter_errors(doc.get("spec", {})):
            failures.append(f"{path}: spec/{'/'.join(map(str, e.absolute_path))}: {e.message}")
    if failures:
        print("\n".join(failures))
        return 1
    print(f"ok: {len(paths)} plan(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
