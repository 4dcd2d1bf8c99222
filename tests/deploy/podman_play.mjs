// What podman can run of a rendered manifest (`kubectl kustomize
// deploy/k8s`), for `podman kube play`: podman 4.3 plays Pods, Deployments,
// ConfigMaps and PersistentVolumeClaims, not StatefulSets, Services or
// PodDisruptionBudgets. Each StatefulSet becomes its first pod, with the
// StatefulSet's own pod template and a claim per volume claim template (as
// Kubernetes would make them); a StatefulSet of one pod is named after its
// Service (`redis`), so the other pods reach it by that name on the podman
// network the play runs on. Services and PodDisruptionBudgets are listed on
// stderr and left out. Containers' ports are dropped (podman 4.3 publishes
// every containerPort on the host, where the proxy's and the replica's
// 50051 would collide; pods reach each other on the network without them),
// and a Deployment runs one pod. A Secret volume named on the command line
// (`--secret NAME=DIR`) becomes a read-only hostPath of DIR, which holds
// the Secret's files (podman 4.3 plays no Secrets). Everything else goes
// through unchanged.
//
//   node tests/deploy/podman_play.mjs rendered.yaml [--secret NAME=DIR] > play.yaml
import { readFileSync } from "node:fs";
import { parseAllDocuments, stringify } from "yaml";

const out = [];
const secrets = {};
for (let i = 3; i < process.argv.length; i += 2) {
  if (process.argv[i] !== "--secret") throw new Error(`unknown argument ${process.argv[i]}`);
  const [name, dir] = process.argv[i + 1].split("=");
  secrets[name] = dir;
}
const withSecretsAsPaths = (podSpec) => {
  for (const v of podSpec.volumes ?? []) {
    const dir = secrets[v.secret?.secretName];
    if (dir === undefined) continue;
    delete v.secret;
    v.hostPath = { path: dir, type: "Directory" };
  }
  return podSpec;
};
const unpublished = (podSpec) => {
  for (const c of podSpec.containers ?? []) {
    // Probes that name a port get its number first.
    const byName = Object.fromEntries((c.ports ?? []).map((p) => [p.name, p.containerPort]));
    for (const probe of [c.readinessProbe, c.livenessProbe, c.startupProbe]) {
      for (const kind of ["tcpSocket", "httpGet", "grpc"]) {
        const port = probe?.[kind]?.port;
        if (typeof port === "string" && port in byName) probe[kind].port = byName[port];
      }
    }
    delete c.ports;
  }
  return podSpec;
};
for (const doc of parseAllDocuments(readFileSync(process.argv[2], "utf8"))) {
  const obj = doc.toJS();
  if (obj == null) continue;
  if (obj.kind === "Service" || obj.kind === "PodDisruptionBudget") {
    console.error(`podman_play: ${obj.kind}/${obj.metadata.name}: podman does not run it`);
    continue;
  }
  if (obj.kind === "Deployment") {
    obj.spec.replicas = 1;
    unpublished(obj.spec.template.spec);
  }
  if (obj.kind !== "StatefulSet") {
    out.push(obj);
    continue;
  }
  const sts = obj;
  const pod = sts.spec.replicas === 1 ? sts.spec.serviceName : `${sts.metadata.name}-0`;
  const spec = withSecretsAsPaths(unpublished(structuredClone(sts.spec.template.spec)));
  spec.volumes = spec.volumes ?? [];
  for (const claim of sts.spec.volumeClaimTemplates ?? []) {
    const name = `${claim.metadata.name}-${pod}`;
    out.push({
      apiVersion: "v1",
      kind: "PersistentVolumeClaim",
      metadata: { name },
      spec: claim.spec,
    });
    spec.volumes.push({ name: claim.metadata.name, persistentVolumeClaim: { claimName: name } });
  }
  if (spec.volumes.length === 0) delete spec.volumes;
  out.push({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: pod, labels: sts.spec.template.metadata?.labels ?? {} },
    spec,
  });
  console.error(`podman_play: StatefulSet/${sts.metadata.name}: pod ${pod}`);
}
process.stdout.write(out.map((o) => stringify(o)).join("---\n"));
