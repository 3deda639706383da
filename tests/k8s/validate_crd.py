"""Validate the documents of a multi-document YAML file whose kinds a CRD in CRD_DIR defines
against that CRD's openAPIV3Schema, as the API server would: the schema itself (jsonschema),
and no field the schema does not declare (the server prunes unknown fields of a structural
schema silently, so a misspelt field would be lost without a word). Documents of other kinds
are skipped and listed. Exit 1 with every problem on stderr.

    python3 validate_crd.py CRD_DIR FILE
"""
import glob
import os
import sys

import jsonschema
import yaml


def load_crds(crd_dir):
    schemas = {}
    for path in glob.glob(os.path.join(crd_dir, "*.yaml")):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                group = doc["spec"]["group"]
                kind = doc["spec"]["names"]["kind"]
                for v in doc["spec"]["versions"]:
                    schemas[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]
    return schemas


def unknown_fields(value, schema, path, out):
    if not isinstance(schema, dict):
        return
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None:
            for k, v in value.items():
                if k in props:
                    unknown_fields(v, props[k], f"{path}.{k}", out)
                elif path.count(".") == 0 and k in ("apiVersion", "kind", "metadata"):
                    pass
                else:
                    out.append(f"{path}.{k}: not a field of the schema")
        elif isinstance(extra, dict):
            for k, v in value.items():
                unknown_fields(v, extra, f"{path}.{k}", out)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            unknown_fields(v, schema["items"], f"{path}[{i}]", out)


def main():
    crd_dir, file = sys.argv[1], sys.argv[2]
    schemas = load_crds(crd_dir)
    problems, checked, skipped = [], [], []
    with open(file) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        schema = schemas.get(key)
        name = f"{d.get('kind')}/{d.get('metadata', {}).get('name')}"
        if schema is None:
            skipped.append(name)
            continue
        checked.append(name)
        for e in jsonschema.Draft7Validator(schema).iter_errors(d):
            problems.append(f"{name}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
        out = []
        unknown_fields(d, schema, "", out)
        problems.extend(f"{name}: {p}" for p in out)
    print("checked: " + ", ".join(checked))
    print("skipped: " + ", ".join(skipped))
    for p in problems:
        print(p, file=sys.stderr)
    sys.exit(1 if problems else 0)


main()
