// Checks every object of a rendered manifest (`kubectl kustomize deploy/k8s`)
// against the Kubernetes API's own schemas (kubernetes-models, generated
// from the OpenAPI spec): types, required fields, enumerations, formats.
// Exits 1 naming each object that fails and why.
//
//   node tests/deploy/validate.mjs rendered.yaml
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs MANIFEST.yaml");
  process.exit(2);
}
let objects = 0;
let invalid = 0;
for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
  if (doc.errors.length > 0) {
    console.error(`${file}: not YAML: ${doc.errors[0].message}`);
    process.exit(1);
  }
  const obj = doc.toJS();
  if (obj == null) continue;
  objects++;
  const name = `${obj.kind}/${obj.metadata?.name}`;
  if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
    console.log(`INVALID ${name}: apiVersion and kind are required`);
    invalid++;
    continue;
  }
  const [group, version] = obj.apiVersion.includes("/")
    ? obj.apiVersion.split("/")
    : ["", obj.apiVersion];
  const path = group === ""
    ? `kubernetes-models/${version}/${obj.kind}`
    : `kubernetes-models/${group}/${version}/${obj.kind}`;
  let Model;
  try {
    Model = (await import(path))[obj.kind];
  } catch {
    console.log(`INVALID ${name}: ${obj.apiVersion} ${obj.kind} is not a Kubernetes API kind`);
    invalid++;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`INVALID ${name}: ${e.message}`);
    invalid++;
  }
}
console.log(`${objects} objects, ${invalid} invalid`);
process.exit(invalid > 0 || objects === 0 ? 1 : 0);
