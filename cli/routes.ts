import { routeCluster, type Routes } from "../controller/planner/route/index.ts";
import { bool, helpText, parseCommandFlags, required } from "./flags.ts";
import { ExitCode, readSnapshotFile, table, writeJson, type Command } from "./io.ts";

const FLAGS = {
  snapshot: required("FILE", "cluster snapshot (JSON), as for `monkeytree plan`", "the cluster snapshot to route"),
  json: bool("print the whole routing document as JSON"),
};

const help = helpText({
  command: "monkeytree routes",
  table: FLAGS,
  about: `Perfect routing for a cluster snapshot: the host order of every DP ring, a dedicated uplink
(and spine) for every cross-rack DP flow, core links for inter-pod flows when the topology
has pods, pipeline flows spread round-robin, and the UDP source port that steers each flow
onto its path under CRC-32 5-tuple ECMP hashing. Hosts are addressed 10.0.0.0 + host + 1.`,
  after: `exit codes: 0 every DP flow has its own links, 1 some links carry several DP flows (the
snapshot exceeds its fragmentation bound; run \`monkeytree plan\` first), 2 bad usage or input.`,
});

export const command: Command = {
  summary: "assign every DP flow a dedicated uplink and the source port that steers it",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const cluster = await readSnapshotFile(flags.snapshot);
    const routes = routeCluster(cluster);
    if (flags.json) await writeJson(io, routes);
    else io.out.write(`${render(routes)}\n`);
    return routes.isolated ? ExitCode.ok : ExitCode.findings;
  },
};

const orNone = (value: number | null) => (value === null ? "-" : value);

function render(routes: Routes): string {
  const links = routes.uplinksPerRack;
  const lines = [
    `${routes.tiers}-tier Clos, ${links} uplinks per rack; Δ = ${routes.delta} colours` +
      (routes.coreDelta === null ? "" : `, ${routes.coreDelta} at the core`) +
      (routes.folded ? `, folded onto ${links} links` : ""),
    routes.isolated
      ? `isolated: every DP flow has its own uplink and downlink (${routes.dpFlows.length} DP flows)`
      : `not isolated: up to ${routes.overlap.maxFlowsPerLink} DP flows share a link` +
        (routes.overlap.racks.length ? ` on racks ${routes.overlap.racks.join(", ")}` : "") +
        (routes.overlap.pods.length ? ` and core links of pods ${routes.overlap.pods.join(", ")}` : ""),
    `source ports: ${routes.hashModel}; ${routes.unsteered} flows without a steering port`,
    "",
    table(
      ["rack", "DP out", "DP in", "uplinks", "max/uplink", "max/downlink"],
      routes.racks.map((r) => [r.rack, r.flowsOut, r.flowsIn, r.uplinks, r.maxFlowsPerUplink, r.maxFlowsPerDownlink]),
    ),
  ];
  if (routes.pods.length) {
    lines.push(
      "",
      table(
        ["pod", "out", "in", "core links", "max/core up", "max/core down"],
        routes.pods.map((p) => [p.pod, p.flowsOut, p.flowsIn, p.coreLinks, p.maxFlowsPerCoreUplink, p.maxFlowsPerCoreDownlink]),
      ),
    );
  }
  if (routes.dpFlows.length) {
    lines.push(
      "",
      "DP flows:",
      table(
        ["job", "group", "ring", "src rack", "dst rack", "uplink (spine)", "downlink", "core", "source port"],
        routes.dpFlows.map((f) => [f.job, f.group, f.ring, f.srcRack, f.dstRack, f.uplink, f.downlink, orNone(f.core), orNone(f.sourcePort)]),
      ),
    );
  }
  if (routes.ppFlows.length) {
    lines.push(
      "",
      "PP flows (round-robin):",
      table(
        ["job", "from stage", "to stage", "replica", "src rack", "dst rack", "uplink (spine)", "downlink", "core", "source port"],
        routes.ppFlows.map((f) => [f.job, f.fromStage, f.toStage, f.replica, f.srcRack, f.dstRack, f.uplink, f.downlink, orNone(f.core), orNone(f.sourcePort)]),
      ),
    );
  }
  return lines.join("\n");
}
