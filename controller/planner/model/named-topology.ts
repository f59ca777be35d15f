import { Lexer, parse as parseYaml } from "yaml";
import { z } from "zod";
import { InvalidInputError } from "../../../sdk/contract/errors.ts";
import {
  MAX_GPUS_PER_HOST,
  MAX_HOSTS,
  MAX_HOSTS_PER_RACK,
  MAX_RACKS,
  MAX_TOPOLOGY_BYTES,
  MAX_UPLINKS_PER_RACK,
} from "../../../sdk/contract/protocol/limits.ts";
import { expandHostlists, HostlistError } from "./hostlist.ts";
import { TopologySchema, type Topology } from "./snapshot.ts";

/**
 * A cluster's topology by name, as operators and the cluster's scheduler speak of it: racks
 * (and pods) with their hosts' names. The model numbers hosts rack by rack with the same
 * number of slots in every rack, so a rack with fewer hosts than the largest gets empty slots:
 * they hold no host and are never a destination (`padding`, which the controller reports as
 * unavailable). Indices stay what snapshots and the planner use; names are what commands take.
 */

const positive = (what: string, max: number) =>
  z
    .int({ error: `${what} must be a whole number` })
    .min(1, { error: `${what} must be at least 1` })
    .max(max, { error: `${what} must be at most ${max}, the largest MonkeyTree supports` });

const NAME = /^[A-Za-z0-9._-]+$/;
/** The longest rack, pod or host name; with `MAX_HOSTS` hosts, it bounds a topology file's size (`MAX_TOPOLOGY_BYTES`). */
const MAX_NAME_LENGTH = 128;
const name = (what: string) =>
  z
    .string({ error: `${what} is a string` })
    .min(1, { error: `${what} must not be empty` })
    .max(MAX_NAME_LENGTH, { error: `${what} is longer than ${MAX_NAME_LENGTH} characters` })
    .regex(NAME, { error: `${what} may hold only letters, digits and . _ -` });

/** Hosts as one hostlist (`n[0-7]`) or a list of names and hostlists. */
const HostsSchema = z.union([z.string(), z.array(z.string()).max(MAX_HOSTS, { error: `at most ${MAX_HOSTS} entries` })], {
  error: 'hosts is a hostlist such as "n[0-7]" or a list of host names',
});

export const TopologyFileSchema = z.strictObject({
  gpusPerHost: positive("gpusPerHost", MAX_GPUS_PER_HOST),
  /** Uplinks of every rack that does not give its own. */
  uplinksPerRack: positive("uplinksPerRack", MAX_UPLINKS_PER_RACK).optional(),
  lambda: z.int().min(0).optional(),
  podLambda: z.int().min(0).optional(),
  racks: z
    .array(
      z.strictObject({
        name: name("a rack's name"),
        /** The pod (aggregation switch) above the rack; give it for every rack or none. */
        pod: name("a pod's name").optional(),
        uplinks: positive("uplinks", MAX_UPLINKS_PER_RACK).optional(),
        hosts: HostsSchema,
      }),
      { error: "racks is a list of racks, each { name, hosts, uplinks, pod }" },
    )
    .min(1, { error: "a topology needs at least one rack" })
    .max(MAX_RACKS, { error: `at most ${MAX_RACKS} racks, the most MonkeyTree supports` }),
});
export type TopologyFile = z.infer<typeof TopologyFileSchema>;

export interface NamedTopology {
  readonly topology: Topology;
  readonly lambda?: number;
  readonly podLambda?: number;
  /** Host name of every global index; null for an empty slot of a short rack. */
  readonly hostNames: readonly (string | null)[];
  readonly hostIndex: ReadonlyMap<string, number>;
  readonly rackNames: readonly string[];
  /** Empty when the topology has no pod tier. */
  readonly podNames: readonly string[];
  /** Slots that hold no host: never a destination. */
  readonly padding: readonly number[];
}

/** A name or index that the topology does not hold. */
export class UnknownHostError extends Error {
  override readonly name = "UnknownHostError";
  readonly code = "unknown_host";
}

/** Reports a problem with the file at `path`; it never returns. */
type Fail = (path: string, message: string) => never;

/** A rack of the file with its hosts expanded and its uplink count settled; `index` is its place in the file. */
interface FileRack {
  readonly index: number;
  readonly name: string;
  readonly pod?: string;
  readonly hosts: readonly string[];
  readonly uplinks: number;
}

/**
 * Validates a parsed topology document; throws `InvalidInputError` naming the field. Racks
 * are numbered pod by pod, in the order pods first appear, then in file order.
 */
export function parseTopologyFile(value: unknown, source = "topology"): NamedTopology {
  const result = TopologyFileSchema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(source, result.error);
  const file = result.data;
  const fail: Fail = (path, message) => {
    throw new InvalidInputError(source, [{ path, message }]);
  };
  const racks = fileRacks(file, fail);
  checkRacksAlike(racks, fail);
  const { podNames, ordered, racksPerPod } = racksByPod(racks, fail);
  checkRackNamesUnique(racks, fail);
  const hostsPerRack = Math.max(...racks.map((rack) => rack.hosts.length));
  const { hostNames, hostIndex, padding } = numberHosts(ordered, hostsPerRack, fail);
  const topology = TopologySchema.safeParse({
    racks: ordered.length,
    hostsPerRack,
    gpusPerHost: file.gpusPerHost,
    uplinksPerRack: racks[0]!.uplinks,
    ...(racksPerPod === undefined ? {} : { racksPerPod }),
  });
  if (!topology.success) throw InvalidInputError.fromZod(source, topology.error);
  if (file.podLambda !== undefined && racksPerPod === undefined) fail("podLambda", "podLambda needs pods: give every rack a pod, or drop podLambda");
  return {
    topology: topology.data,
    ...(file.lambda === undefined ? {} : { lambda: file.lambda }),
    ...(file.podLambda === undefined ? {} : { podLambda: file.podLambda }),
    hostNames,
    hostIndex,
    rackNames: ordered.map((rack) => rack.name),
    podNames,
    padding,
  };
}

function fileRacks(file: TopologyFile, fail: Fail): FileRack[] {
  return file.racks.map((rack, r) => {
    const hosts = rackHosts(rack, (message) => fail(`racks[${r}].hosts`, message));
    const uplinks =
      rack.uplinks ??
      file.uplinksPerRack ??
      fail(`racks[${r}].uplinks`, `rack "${rack.name}" has no uplink count: give it "uplinks" or give the file "uplinksPerRack"`);
    return { ...rack, index: r, hosts, uplinks };
  });
}

/** Every rack has the first rack's uplink count, and a pod if and only if it has one. */
function checkRacksAlike(racks: readonly FileRack[], fail: Fail): void {
  const first = racks[0]!;
  for (const rack of racks) {
    // The planner's bound is one number for every rack.
    if (rack.uplinks !== first.uplinks) {
      fail(
        `racks[${rack.index}].uplinks`,
        `rack "${rack.name}" has ${rack.uplinks} uplinks but rack "${first.name}" has ${first.uplinks}; MonkeyTree takes one uplink count for every rack, so give the smallest to all`,
      );
    }
    if ((rack.pod === undefined) !== (first.pod === undefined)) {
      fail(`racks[${rack.index}].pod`, "give a pod to every rack or to none");
    }
  }
}

/**
 * The pods in the order they first appear, and the racks in the model's order: pod by pod,
 * then in file order. Every pod must hold the same number of racks (`racksPerPod`, undefined
 * without pods).
 */
function racksByPod(racks: readonly FileRack[], fail: Fail): { podNames: string[]; ordered: readonly FileRack[]; racksPerPod: number | undefined } {
  const podNames = [...new Set(racks.flatMap((rack) => (rack.pod === undefined ? [] : [rack.pod])))];
  const ordered = podNames.length ? podNames.flatMap((pod) => racks.filter((rack) => rack.pod === pod)) : racks;
  let racksPerPod: number | undefined;
  if (podNames.length) {
    racksPerPod = ordered.length / podNames.length;
    for (const pod of podNames) {
      const count = racks.filter((rack) => rack.pod === pod).length;
      if (count !== racksPerPod) {
        fail("racks", `pod "${pod}" has ${count} racks but the pods average ${racksPerPod.toFixed(2)}; MonkeyTree needs the same number of racks in every pod`);
      }
    }
  }
  return { podNames, ordered, racksPerPod };
}

function checkRackNamesUnique(racks: readonly FileRack[], fail: Fail): void {
  const seenRacks = new Set<string>();
  for (const rack of racks) {
    if (seenRacks.has(rack.name)) fail(`racks[${rack.index}].name`, `rack name "${rack.name}" is used twice`);
    seenRacks.add(rack.name);
  }
}

/** Global indices of the hosts of `ordered` racks, `hostsPerRack` slots a rack; a short rack's last slots are padding. */
function numberHosts(ordered: readonly FileRack[], hostsPerRack: number, fail: Fail): Pick<NamedTopology, "hostNames" | "hostIndex" | "padding"> {
  const hostNames: (string | null)[] = [];
  const hostIndex = new Map<string, number>();
  const padding: number[] = [];
  for (const rack of ordered) {
    for (let slot = 0; slot < hostsPerRack; slot++) {
      const host = rack.hosts[slot];
      const index = hostNames.length;
      if (host === undefined) {
        hostNames.push(null);
        padding.push(index);
        continue;
      }
      if (hostIndex.has(host))
        fail(`racks[${rack.index}].hosts`, `host "${host}" is listed twice (also in rack "${ordered[Math.floor(hostIndex.get(host)! / hostsPerRack)]!.name}")`);
      hostIndex.set(host, index);
      hostNames.push(host);
    }
  }
  return { hostNames, hostIndex, padding };
}

/**
 * A rack's host names, expanded no further than what a rack may hold, so a short
 * hostlist (or thousands of them) cannot stand for millions of names.
 */
function rackHosts(rack: { name: string; hosts: string | string[] }, fail: (message: string) => never): string[] {
  let hosts: string[] = [];
  try {
    hosts = expandHostlists(typeof rack.hosts === "string" ? [rack.hosts] : rack.hosts, MAX_HOSTS_PER_RACK);
  } catch (error) {
    if (error instanceof HostlistError)
      fail(error.overLimit ? `rack "${rack.name}" has more than ${MAX_HOSTS_PER_RACK} hosts, the most MonkeyTree supports` : error.message);
    throw error;
  }
  if (hosts.length === 0) fail(`rack "${rack.name}" lists no hosts`);
  const long = hosts.find((host) => host.length > MAX_NAME_LENGTH);
  if (long !== undefined) fail(`host "${long.slice(0, 60)}..." is longer than ${MAX_NAME_LENGTH} characters`);
  return hosts;
}

/**
 * YAML tokens (scalars, indicators, line breaks) in the largest supported topology with one
 * host a line: 130,000, lexed in a fifth of a second. Building the document costs far more
 * per token, so a file of many tiny nodes is refused before it is built.
 */
const MAX_TOPOLOGY_TOKENS = 400_000;

/** Whether YAML's lexer finds at most `max` tokens in `text`; it stops counting past them. */
function withinTokens(text: string, max: number): boolean {
  const tokens = new Lexer().lex(text);
  for (let count = 0; !tokens.next().done; count++) if (count >= max) return false;
  return true;
}

/** Parses a topology document written as YAML or JSON (JSON is YAML); syntax errors become `InvalidInputError`. */
export function parseTopologyText(text: string, source = "topology"): NamedTopology {
  if (text.length > MAX_TOPOLOGY_BYTES)
    throw new InvalidInputError(source, [{ path: "", message: `it holds more than ${MAX_TOPOLOGY_BYTES} characters, the most a topology file may have` }]);
  if (!withinTokens(text, MAX_TOPOLOGY_TOKENS)) {
    throw new InvalidInputError(source, [
      { path: "", message: `it holds more than ${MAX_TOPOLOGY_TOKENS} YAML tokens, far more than the largest topology MonkeyTree supports` },
    ]);
  }
  let value: unknown;
  try {
    // Aliases could expand a small file into a huge document; a topology needs none.
    value = parseYaml(text, { maxAliasCount: 0 });
  } catch (error) {
    const detail = error instanceof Error ? error.message.split("\n")[0] : String(error);
    throw new InvalidInputError(source, [{ path: "", message: `not valid YAML or JSON (${detail})` }]);
  }
  return parseTopologyFile(value, source);
}

/**
 * The global index of a host given by name, or by index as a string of digits.
 *
 * @throws UnknownHostError naming the host and what the topology holds
 */
export function hostIndexOf(named: NamedTopology, host: string): number {
  const byName = named.hostIndex.get(host);
  if (byName !== undefined) return byName;
  if (/^\d+$/.test(host)) {
    const index = Number(host);
    if (index < named.hostNames.length && named.hostNames[index] !== null) return index;
  }
  const some = [...named.hostIndex.keys()].slice(0, 3).join(", ");
  throw new UnknownHostError(`host "${host}" is not in the topology; it names ${named.hostIndex.size} hosts (${some}${named.hostIndex.size > 3 ? ", …" : ""})`);
}

/** The name of a global index, or the index itself for an empty slot. */
export const hostName = (named: NamedTopology, index: number): string => named.hostNames[index] ?? `#${index}`;
