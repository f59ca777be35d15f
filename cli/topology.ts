import { parseTopologyFile, parseTopologyText, type NamedTopology } from "../controller/model/named-topology.ts";
import { topologyFromConf } from "../controller/slurm/topology-conf.ts";
import { intFlag, readInputFile, UsageError } from "./io.ts";

/** Flags shared by the commands that read a topology by name. */
export const TOPOLOGY_FLAGS = {
  topology: { type: "string" },
  "uplinks-per-rack": { type: "string" },
  "gpus-per-host": { type: "string" },
} as const;

export const TOPOLOGY_HELP = `  --topology FILE        the cluster's racks (and pods) with their hosts' names: a MonkeyTree
                         topology file (YAML or JSON), or Slurm's topology.conf (tree plugin:
                         leaf switches are racks, the switches above them pods), which also
                         needs --uplinks-per-rack
  --uplinks-per-rack N   uplinks of every rack, for a topology.conf
  --gpus-per-host N      GPUs of every host, for a topology.conf (default 8)`;

/** Whether `text` is Slurm's topology.conf rather than a YAML or JSON document. */
const isTopologyConf = (path: string, text: string): boolean => path.endsWith(".conf") || /^\s*SwitchName=/im.test(text);

/**
 * Reads `--topology FILE`: a topology document, or a topology.conf with the uplink and GPU
 * counts it does not hold. Every failure names the file, or the flag to add.
 */
export async function readTopology(path: string, flags: { "uplinks-per-rack"?: string | undefined; "gpus-per-host"?: string | undefined }): Promise<NamedTopology> {
  const text = await readInputFile(path, "topology");
  if (!isTopologyConf(path, text)) {
    if (flags["uplinks-per-rack"] !== undefined || flags["gpus-per-host"] !== undefined) {
      throw new UsageError(`--uplinks-per-rack and --gpus-per-host go with a topology.conf; ${path} gives them itself`);
    }
    return parseTopologyText(text, `topology ${path}`);
  }
  if (flags["uplinks-per-rack"] === undefined) throw new UsageError(`${path} is a Slurm topology.conf, which does not say how many uplinks a rack has: add --uplinks-per-rack N`);
  const source = `topology ${path}`;
  const file = topologyFromConf(text, { uplinksPerRack: intFlag("uplinks-per-rack", flags["uplinks-per-rack"], undefined, 1), gpusPerHost: intFlag("gpus-per-host", flags["gpus-per-host"], 8, 1) }, source);
  return parseTopologyFile(file, source);
}
