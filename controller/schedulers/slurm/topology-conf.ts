import { InvalidInputError } from "../../../sdk/contract/errors.ts";
import { expandHostlist, HostlistError } from "../../planner/model/hostlist.ts";
import type { TopologyFile } from "../../planner/model/named-topology.ts";
import { MAX_HOSTS } from "../../../sdk/contract/protocol/limits.ts";

/**
 * Slurm's `topology.conf` for the tree plugin, read as a MonkeyTree topology: every leaf
 * switch (`SwitchName=… Nodes=…`) is a rack, and in a tree of three levels or more the
 * switches right above the leaves are pods. A two-level tree (leaves under one top switch) has
 * no pod tier. The file says nothing of uplinks or GPUs, so they are given.
 */

export interface TopologyConfOptions {
  readonly uplinksPerRack: number;
  readonly gpusPerHost: number;
}

interface Switch {
  readonly name: string;
  readonly line: number;
  readonly nodes: string[];
  readonly switches: string[];
}

/** At most this many switches: racks plus pods plus the levels above, for the largest cluster. */
const MAX_SWITCHES = 4096;

/** The topology document `topology.conf`'s text describes; `parseTopologyFile` validates it. */
export function topologyFromConf(text: string, options: TopologyConfOptions, source = "topology.conf"): TopologyFile {
  const fail = (line: number, message: string): never => {
    throw new InvalidInputError(source, [{ path: `line ${line}`, message }]);
  };
  const switches = new Map<string, Switch>();
  // Hosts named so far: every line's Nodes= expands only as far as the whole file may.
  let hosts = 0;
  text.split("\n").forEach((raw, i) => {
    const line = i + 1;
    const content = raw.replace(/#.*/, "").trim();
    if (content === "") return;
    const fields = new Map<string, string>();
    for (const token of content.split(/\s+/)) {
      const eq = token.indexOf("=");
      if (eq <= 0) fail(line, `"${token.slice(0, 60)}" is not KEY=VALUE`);
      fields.set(token.slice(0, eq).toLowerCase(), token.slice(eq + 1));
    }
    const name = fields.get("switchname") ?? fail(line, "every line of topology.conf starts with SwitchName=NAME");
    if (switches.has(name)) fail(line, `switch "${name}" is defined twice`);
    if (switches.size >= MAX_SWITCHES) fail(line, `more than ${MAX_SWITCHES} switches`);
    const expand = (key: string, limit: number, over: string): string[] => {
      const list = fields.get(key);
      if (list === undefined) return [];
      try {
        return expandHostlist(list, limit);
      } catch (error) {
        if (error instanceof HostlistError) return fail(line, error.overLimit ? over : error.message);
        throw error;
      }
    };
    const nodes = expand("nodes", MAX_HOSTS - hosts, `the Nodes= lists so far name more than ${MAX_HOSTS} hosts, the most MonkeyTree supports`);
    hosts += nodes.length;
    const entry = { name, line, nodes, switches: expand("switches", MAX_SWITCHES, `switch "${name}" lists more than ${MAX_SWITCHES} switches`) };
    if (entry.nodes.length && entry.switches.length)
      fail(line, `switch "${name}" lists both Nodes and Switches; MonkeyTree reads hosts only under leaf switches`);
    switches.set(name, entry);
  });

  const parent = new Map<string, string>();
  for (const s of switches.values()) {
    for (const child of s.switches) {
      if (!switches.has(child)) fail(s.line, `switch "${s.name}" names switch "${child}", which no line defines`);
      const other = parent.get(child);
      if (other !== undefined) fail(s.line, `switch "${child}" is under both "${other}" and "${s.name}"; a tree gives each switch one parent`);
      parent.set(child, s.name);
    }
  }
  refuseCycles(switches, parent, fail);
  const leaves = [...switches.values()].filter((s) => s.nodes.length > 0);
  if (leaves.length === 0) fail(1, "no switch lists Nodes=; the racks are the leaf switches with their nodes");
  // Pods exist when some leaf's parent has a parent of its own.
  const podOf = (leaf: Switch): string | undefined => {
    const up = parent.get(leaf.name);
    return up !== undefined && parent.has(up) ? up : undefined;
  };
  const withPods = leaves.some((leaf) => podOf(leaf) !== undefined);
  return {
    gpusPerHost: options.gpusPerHost,
    uplinksPerRack: options.uplinksPerRack,
    racks: leaves.map((leaf) => {
      const pod = withPods ? (podOf(leaf) ?? fail(leaf.line, `rack switch "${leaf.name}" has no pod switch above it, while other racks do`)) : undefined;
      return { name: leaf.name, hosts: leaf.nodes, ...(pod === undefined ? {} : { pod }) };
    }),
  };
}

/**
 * Fails on a switch that is its own ancestor (one that lists itself, or A → B → A through
 * `Switches=`), naming the switches around the loop: a tree has none, and the levels above a
 * rack would never end.
 */
function refuseCycles(switches: ReadonlyMap<string, Switch>, parent: ReadonlyMap<string, string>, fail: (line: number, message: string) => never): void {
  // Switches already known to lead up to a root.
  const rooted = new Set<string>();
  for (const start of switches.keys()) {
    const path: string[] = [];
    const onPath = new Set<string>();
    for (let at: string | undefined = start; at !== undefined && !rooted.has(at); at = parent.get(at)) {
      if (onPath.has(at)) {
        const loop = [...path.slice(path.indexOf(at)), at].reverse();
        fail(
          switches.get(at)!.line,
          `Switches= go round in a loop, ${loop.map((name) => `"${name}"`).join(" → ")}; a tree's switches lead down to the racks without one`,
        );
      }
      path.push(at);
      onPath.add(at);
    }
    for (const name of path) rooted.add(name);
  }
}
