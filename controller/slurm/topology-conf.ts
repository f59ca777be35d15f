import { InvalidInputError } from "../../sdk/errors.ts";
import { expandHostlist, HostlistError } from "../model/hostlist.ts";
import type { TopologyFile } from "../model/named-topology.ts";

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
    const expand = (key: string): string[] => {
      const list = fields.get(key);
      if (list === undefined) return [];
      try {
        return expandHostlist(list);
      } catch (error) {
        if (error instanceof HostlistError) return fail(line, error.message);
        throw error;
      }
    };
    const entry = { name, line, nodes: expand("nodes"), switches: expand("switches") };
    if (entry.nodes.length && entry.switches.length) fail(line, `switch "${name}" lists both Nodes and Switches; MonkeyTree reads hosts only under leaf switches`);
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
