import { writeFile } from "node:fs/promises";
import { parseSnapshot } from "../controller/planner/model/cluster.ts";
import { hostName, type NamedTopology } from "../controller/planner/model/named-topology.ts";
import type { SnapshotInput } from "../controller/planner/model/snapshot.ts";
import { SlurmAdapter, type AdapterState } from "../controller/schedulers/slurm/adapter.ts";
import { Slurm, SlurmCommandError, SlurmNotInstalledError } from "../controller/schedulers/slurm/commands.ts";
import { COMMENT_POLICIES } from "../controller/schedulers/slurm/view.ts";
import { createLogger } from "../sdk/contract/log.ts";
import { loadConfig } from "./config.ts";
import { bool, checked, choice, helpText, parseCommandFlags, seconds, str } from "./flags.ts";
import { ExitCode, table, UsageError, writeJson, type Command } from "./io.ts";
import { writableFile } from "./output.ts";
import { loadTopology, TOPOLOGY_FLAGS } from "./topology.ts";

/** `--slurm-comments`, for every command that reads Slurm's jobs: how their ring comments count. */
export const SLURM_COMMENTS_FLAG = {
  "slurm-comments": choice(
    COMMENT_POLICIES,
    "a pinned job's `monkeytree:rings=N` comment counts up to the GPUs it has on the rack where it has fewest (bounded), " +
      "or not at all (ignore: every pinned job counts 1 ring)",
    "bounded",
  ),
} as const;

/** `--slurm-conf`, for every command that runs Slurm's commands. */
export const SLURM_CONF_FLAG = { "slurm-conf": str("FILE", "slurm.conf for Slurm's commands (default: $SLURM_CONF, then theirs)") } as const;

const FLAGS = {
  ...TOPOLOGY_FLAGS,
  ...SLURM_CONF_FLAG,
  ...SLURM_COMMENTS_FLAG,
  timeout: seconds("S", "give up on a Slurm command after S seconds", { default: 10, min: 0.1 }),
  json: bool("print the view as JSON: the snapshot, unavailable hosts with reasons, holds"),
  output: checked("FILE", 'write the snapshot (pinned jobs "movable": false, "unavailable" hosts) for `monkeytree plan --snapshot FILE`', writableFile),
};

const help = helpText({
  command: "monkeytree slurm",
  table: FLAGS,
  about: `Reads, once, what Slurm says of the cluster's nodes and jobs and of MonkeyTree's holds, and
prints the cluster as the controller plans it under Slurm: every running job pinned (counted
in its racks' fragmentation, never moved; its rings from a \`monkeytree:rings=N\` in its
comment, at most its GPUs on the rack where it has fewest, else 1), every host no worker may
move to and why (down, drained, reserved, planned by the backfill scheduler, allocated to a
job, or an empty slot of a short rack), and the holds. It changes nothing in Slurm. Jobs whose
launchers registered with a controller are movable there; this command, which asks no
controller, lists them as pinned too.`,
  after: `exit codes: 0 read, 2 bad usage or input, or Slurm's commands not installed here,
3 Slurm did not answer.`,
});

export const command: Command = {
  summary: "show the cluster as Slurm holds it: pinned jobs, unavailable hosts, holds",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const topology = await loadTopology(flags, await loadConfig());
    if (!topology) throw new UsageError("--topology is required: the cluster's topology file or Slurm's topology.conf");
    const slurm = new Slurm({
      timeoutMs: flags.timeout,
      ...(flags["slurm-conf"] === undefined ? {} : { conf: flags["slurm-conf"] }),
    });
    const adapter = new SlurmAdapter({
      slurm,
      topology,
      managed: () => new Set(),
      comments: flags["slurm-comments"],
      log: createLogger("slurm", (line) => io.err.write(`${line}\n`)),
    });
    let state: AdapterState;
    try {
      slurm.requireCommands();
      state = await adapter.poll(false);
    } catch (error) {
      if (error instanceof SlurmNotInstalledError) {
        io.err.write(`monkeytree slurm: ${error.detail}\n`);
        return ExitCode.usage;
      }
      if (error instanceof SlurmCommandError) {
        io.err.write(`monkeytree slurm: ${error.message}\n`);
        return ExitCode.internal;
      }
      throw error;
    }
    const snapshot = snapshotOf(topology, state);
    if (flags.output !== undefined) await writeFile(flags.output, `${JSON.stringify(snapshot, null, 2)}\n`);
    if (flags.json) {
      const name = (host: number) => hostName(topology, host);
      await writeJson(io, { snapshot, unavailable: state.unavailable.map((u) => ({ ...u, name: name(u.host) })), holds: state.holds, notes: state.notes });
    } else io.out.write(`${render(topology, state)}\n`);
    return ExitCode.ok;
  },
};

/** The planner's input: the topology, the pinned jobs and the hosts no worker may move to. */
function snapshotOf(topology: NamedTopology, state: AdapterState): SnapshotInput {
  const document: SnapshotInput = {
    topology: topology.topology,
    ...(topology.lambda === undefined ? {} : { lambda: topology.lambda }),
    ...(topology.podLambda === undefined ? {} : { podLambda: topology.podLambda }),
    jobs: state.pinned.map((job) => ({ id: job.id, rings: job.rings, hosts: [...job.hosts], movable: false })),
    unavailable: state.unavailable.map((u) => u.host),
  };
  // Validated like any snapshot, so what is written is what `monkeytree plan` reads.
  parseSnapshot(document, "the snapshot from Slurm");
  return document;
}

function render(topology: NamedTopology, state: AdapterState): string {
  const t = topology.topology;
  const name = (host: number) => hostName(topology, host);
  const slots = state.unavailable.filter((u) => topology.hostNames[u.host] === null).length;
  const lines = [
    `${t.racks} racks × ${t.hostsPerRack} hosts, ${t.uplinksPerRack} uplinks per rack; ` +
      `${state.pinned.length} pinned jobs, ${state.unavailable.length - slots} unavailable hosts${slots ? ` (and ${slots} empty slots)` : ""}, ${state.holds.length} holds`,
  ];
  if (state.pinned.length)
    lines.push(
      "",
      table(
        ["pinned job", "rings", "hosts"],
        state.pinned.map((j) => [j.id, j.rings, j.hosts.map(name).join(" ")]),
      ),
    );
  const hosts = state.unavailable.filter((u) => topology.hostNames[u.host] !== null);
  if (hosts.length)
    lines.push(
      "",
      table(
        ["unavailable", "why"],
        hosts.map((u) => [name(u.host), u.why]),
      ),
    );
  if (state.holds.length)
    lines.push(
      "",
      table(
        ["hold", "job", "node"],
        state.holds.map((h) => [h.name, h.job, h.node]),
      ),
    );
  for (const note of state.notes) lines.push(`note: ${note}`);
  return lines.join("\n");
}
