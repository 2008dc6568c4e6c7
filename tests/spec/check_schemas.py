#!/usr/bin/python3
"""tests/spec/check_schemas.py - the JSON Schemas in schemas/ against the spec parser's cases.

Checks that schemas/spec.schema.json, schemas/out_shardings.schema.json and schemas/cluster.schema.json
are valid draft-07 schemas, that their shared definitions (placement, placement_list, output_tree,
output_subtree; the cluster profile's device and links) are identical,
that every sample spec under sample_models/specs/ is valid, and that for every case in
tests/spec/spec_cases.json the schema decides as the case's `schema_valid` says. The same cases run
through the C++ parser in spec_test, which checks `parser_error`; here we also check that the two agree
where they must: a document the parser accepts is schema-valid, one the schema rejects the parser
rejects too. Run from the source root with the system python (Debian's python3-jsonschema).
"""
import glob
import json
import os
import sys

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_DEFINITIONS = ["placement", "placement_list", "output_tree", "output_subtree"]


def load(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return json.load(f)


def main():
    failures = []
    spec_schema = load("schemas/spec.schema.json")
    out_schema = load("schemas/out_shardings.schema.json")
    cluster_schema = load("schemas/cluster.schema.json")
    for name, schema in [("spec", spec_schema), ("out_shardings", out_schema),
                         ("cluster", cluster_schema)]:
        try:
            jsonschema.Draft7Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            failures.append(f"{name} schema is not a valid draft-07 schema: {e.message}")
    for d in SHARED_DEFINITIONS:
        if spec_schema["definitions"].get(d) != out_schema["definitions"].get(d):
            failures.append(f"definition '{d}' differs between the two schemas")
    # The cluster profile takes the spec's device and links.
    for d in ["device_kind", "link", "kind_link", "mesh_dim_network"]:
        if spec_schema["definitions"].get(d) != cluster_schema["definitions"].get(d):
            failures.append(f"definition '{d}' differs between the spec and cluster schemas")
    if spec_schema["properties"]["device"] != cluster_schema["properties"]["device"]:
        failures.append("'device' differs between the spec and cluster schemas")
    if failures:
        print("\n".join(failures))
        return 1
    validators = {"spec": jsonschema.Draft7Validator(spec_schema),
                  "out_shardings": jsonschema.Draft7Validator(out_schema),
                  "cluster": jsonschema.Draft7Validator(cluster_schema)}

    samples = sorted(glob.glob(os.path.join(ROOT, "sample_models", "specs", "*.json")))
    if not samples:
        failures.append("no sample specs under sample_models/specs")
    for path in samples:
        with open(path) as f:
            doc = json.load(f)
        errors = list(validators["spec"].iter_errors(doc))
        if errors:
            failures.append(f"{os.path.relpath(path, ROOT)}: {errors[0].message}")

    cases = load("tests/spec/spec_cases.json")
    count = 0
    for kind in ["spec", "out_shardings", "cluster"]:
        for case in cases[kind]:
            count += 1
            name = f"{kind} case '{case['name']}'"
            errors = list(validators[kind].iter_errors(case["doc"]))
            valid = not errors
            if valid != case["schema_valid"]:
                why = f" ({errors[0].message})" if errors else ""
                failures.append(f"{name}: schema says {'valid' if valid else 'invalid'}{why}, "
                                f"the case says {'valid' if case['schema_valid'] else 'invalid'}")
            if case["parser_error"] is None and not case["schema_valid"]:
                failures.append(f"{name}: the parser accepts it, so the schema must too")

    if failures:
        print("\n".join(failures))
        print(f"{len(failures)} failure(s)")
        return 1
    print(f"ok: 3 schemas, {len(samples)} sample specs, {count} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
