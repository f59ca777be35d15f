import { hostIndexOf, parseTopologyFile, parseTopologyText, UnknownHostError, type NamedTopology } from "../controller/planner/model/named-topology.ts";
import { topologyFromConf } from "../controller/schedulers/slurm/topology-conf.ts";
import { MAX_TOPOLOGY_BYTES } from "../sdk/contract/protocol/limits.ts";
import type { Config } from "./config.ts";
import { str } from "./flags.ts";
import { intFlag, readInputFile, UsageError } from "./io.ts";

/**
 * Flags shared by the commands that read a topology by name. A topology.conf's uplink and GPU
 * counts stay text here: a YAML or JSON topology refuses them, and the site configuration
 * fills in what they leave out (`loadTopology`).
 */
export const TOPOLOGY_FLAGS = {
  topology: str(
    "FILE",
    "the cluster's racks (and pods) with their hosts' names: a MonkeyTree topology file (YAML or JSON), or Slurm's topology.conf " +
      "(tree plugin: leaf switches are racks, the switches above them pods), which also needs --uplinks-per-rack. " +
      "Default: the site configuration's (docs/slurm.md)",
  ),
  "uplinks-per-rack": str("N", "uplinks of every rack, for a topology.conf (default: the site configuration's)"),
  "gpus-per-host": str("N", "GPUs of every host, for a topology.conf (default: the site configuration's, else 8)"),
} as const;

/** Whether `text` is Slurm's topology.conf rather than a YAML or JSON document. */
const isTopologyConf = (path: string, text: string): boolean => path.endsWith(".conf") || /^\s*SwitchName=/im.test(text);

type TopologyFlags = { topology?: string | undefined; "uplinks-per-rack"?: string | undefined; "gpus-per-host"?: string | undefined };

/**
 * The topology from `--topology FILE`, else from the site configuration; null when neither
 * names one. A topology.conf needs uplink and GPU counts it does not hold: from the flags, the
 * configuration, or (GPUs only) 8. `namesOnly` is for commands that only turn host names
 * into indices, which those counts do not change.
 */
export async function loadTopology(flags: TopologyFlags, config: Config, namesOnly = false): Promise<NamedTopology | null> {
  const path = flags.topology ?? config.topology;
  if (path === undefined) return null;
  const text = await readInputFile(path, "topology", MAX_TOPOLOGY_BYTES);
  const source = `topology ${path}`;
  if (!isTopologyConf(path, text)) {
    if (flags["uplinks-per-rack"] !== undefined || flags["gpus-per-host"] !== undefined) {
      throw new UsageError(`--uplinks-per-rack and --gpus-per-host go with a topology.conf; ${path} gives them itself`);
    }
    return parseTopologyText(text, source);
  }
  const uplinksPerRack =
    flags["uplinks-per-rack"] === undefined
      ? (config.uplinksPerRack ?? (namesOnly ? 1 : undefined))
      : intFlag("uplinks-per-rack", flags["uplinks-per-rack"], undefined, 1);
  if (uplinksPerRack === undefined)
    throw new UsageError(`${path} is a Slurm topology.conf, which does not say how many uplinks a rack has: add --uplinks-per-rack N`);
  const gpusPerHost = intFlag("gpus-per-host", flags["gpus-per-host"], config.gpusPerHost ?? 8, 1);
  return parseTopologyFile(topologyFromConf(text, { uplinksPerRack, gpusPerHost }, source), source);
}

/**
 * The global index of `--host`: a name of the topology, or an index. Without a topology only
 * an index is accepted.
 */
export function hostFlag(raw: string, topology: NamedTopology | null): number {
  if (topology === null) {
    if (/^\d+$/.test(raw)) return Number(raw);
    throw new UsageError(
      `--host must be a whole number ≥ 0 or, with a topology (--topology FILE, or "topology" in the site configuration $MONKEYTREE_CONFIG), a host's name; got "${raw}"`,
    );
  }
  try {
    return hostIndexOf(topology, raw);
  } catch (error) {
    if (error instanceof UnknownHostError) throw new UsageError(error.message);
    throw error;
  }
}
