import { describe, expect, it } from "vitest";
import { expandHostlist, HostlistError } from "../../controller/planner/model/hostlist.ts";
import { hostIndexOf, hostName, parseTopologyFile, parseTopologyText, UnknownHostError } from "../../controller/planner/model/named-topology.ts";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { topologyFromConf } from "../../controller/schedulers/slurm/topology-conf.ts";

const rejection = (run: () => unknown): string => {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(InvalidInputError);
    return (error as Error).message;
  }
  throw new Error("expected a rejection");
};

describe("hostlists", () => {
  it("expands ranges, lists, padding and several brackets in Slurm's order", () => {
    expect(expandHostlist("n[0-3,7]")).toEqual(["n0", "n1", "n2", "n3", "n7"]);
    expect(expandHostlist("gpu[08-10],login")).toEqual(["gpu08", "gpu09", "gpu10", "login"]);
    expect(expandHostlist("r[0-1]n[0-1]")).toEqual(["r0n0", "r0n1", "r1n0", "r1n1"]);
    expect(expandHostlist("a,b[2]")).toEqual(["a", "b2"]);
    expect(expandHostlist("")).toEqual([]);
  });

  it("refuses malformed lists, naming the part", () => {
    expect(() => expandHostlist("n[0-3")).toThrow(/unclosed "\["/);
    expect(() => expandHostlist("n[3-1]")).toThrow(/runs backwards/);
    expect(() => expandHostlist("n[a-b]")).toThrow(HostlistError);
    expect(() => expandHostlist("n[[0]]")).toThrow(/nested/);
    expect(() => expandHostlist("a,,b")).toThrow(/empty item/);
    expect(() => expandHostlist("bad name")).toThrow(/not a host name/);
  });

  it("bounds what a short string may expand to", () => {
    expect(() => expandHostlist("n[0-99999999]")).toThrow(/more than 16384 hosts/);
    expect(() => expandHostlist("a[0-255]b[0-255]")).toThrow(/more than 16384 hosts/);
    expect(() => expandHostlist(Array(16_400).fill("x[0]").join(","))).toThrow(/more than 16384/);
  });
});

describe("topology by name", () => {
  it("numbers hosts rack by rack, pod by pod, and pads short racks with unavailable slots", () => {
    const named = parseTopologyText(
      `gpusPerHost: 8
uplinksPerRack: 4
racks:
  - { name: r0, pod: p0, hosts: "n[0-2]" }
  - { name: r2, pod: p1, hosts: [m0, m1] }
  - { name: r1, pod: p0, hosts: [n3] }
  - { name: r3, pod: p1, hosts: "m[2-3]", uplinks: 4 }
`,
      "topology t.yaml",
    );
    expect(named.topology).toEqual({ racks: 4, hostsPerRack: 3, gpusPerHost: 8, uplinksPerRack: 4, racksPerPod: 2 });
    expect(named.rackNames).toEqual(["r0", "r1", "r2", "r3"]);
    expect(named.podNames).toEqual(["p0", "p1"]);
    expect(named.hostNames).toEqual(["n0", "n1", "n2", "n3", null, null, "m0", "m1", null, "m2", "m3", null]);
    expect(named.padding).toEqual([4, 5, 8, 11]);
    expect(hostIndexOf(named, "m2")).toBe(9);
    expect(hostIndexOf(named, "3")).toBe(3);
    expect(hostName(named, 9)).toBe("m2");
    expect(() => hostIndexOf(named, "x9")).toThrow(UnknownHostError);
    expect(() => hostIndexOf(named, "4")).toThrow(/not in the topology/);
  });

  it("reads JSON as well", () => {
    const named = parseTopologyText(JSON.stringify({ gpusPerHost: 1, racks: [{ name: "a", uplinks: 2, hosts: "h[0-1]" }] }));
    expect(named.topology).toEqual({ racks: 1, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 2 });
    expect(named.podNames).toEqual([]);
  });

  it("refuses what the model cannot represent, naming the field", () => {
    const base = { gpusPerHost: 8, uplinksPerRack: 2 };
    expect(
      rejection(() =>
        parseTopologyFile(
          {
            ...base,
            racks: [
              { name: "a", hosts: "n0" },
              { name: "b", uplinks: 3, hosts: "n1" },
            ],
          },
          "topology t",
        ),
      ),
    ).toBe(
      'topology t at racks[1].uplinks: rack "b" has 3 uplinks but rack "a" has 2; MonkeyTree takes one uplink count for every rack, so give the smallest to all',
    );
    expect(rejection(() => parseTopologyFile({ gpusPerHost: 8, racks: [{ name: "a", hosts: "n0" }] }, "topology t"))).toMatch(
      /racks\[0\]\.uplinks: rack "a" has no uplink count/,
    );
    expect(
      rejection(() =>
        parseTopologyFile(
          {
            ...base,
            racks: [
              { name: "a", hosts: "n0" },
              { name: "b", hosts: "n0" },
            ],
          },
          "topology t",
        ),
      ),
    ).toMatch(/host "n0" is listed twice \(also in rack "a"\)/);
    expect(
      rejection(() =>
        parseTopologyFile(
          {
            ...base,
            racks: [
              { name: "a", pod: "p", hosts: "n0" },
              { name: "b", hosts: "n1" },
            ],
          },
          "topology t",
        ),
      ),
    ).toMatch(/racks\[1\]\.pod: give a pod to every rack or to none/);
    expect(
      rejection(() =>
        parseTopologyFile(
          {
            ...base,
            racks: [
              { name: "a", pod: "p", hosts: "n0" },
              { name: "b", pod: "p", hosts: "n1" },
              { name: "c", pod: "q", hosts: "n2" },
            ],
          },
          "topology t",
        ),
      ),
    ).toMatch(/same number of racks in every pod/);
    expect(rejection(() => parseTopologyFile({ ...base, racks: [{ name: "a", hosts: "n[0-" }] }, "topology t"))).toMatch(
      /at racks\[0\]\.hosts: hostlist "n\[0-" has an unclosed/,
    );
    expect(rejection(() => parseTopologyFile({ ...base, rack: [] }, "topology t"))).toMatch(/at racks: racks is a list of racks/);
    expect(rejection(() => parseTopologyText("racks: [", "topology t"))).toMatch(/^topology t: not valid YAML or JSON/);
    expect(rejection(() => parseTopologyText("a: &x [1]\nb: *x\n", "topology t"))).toMatch(/not valid YAML or JSON/);
  });
});

describe("Slurm's topology.conf", () => {
  const options = { uplinksPerRack: 8, gpusPerHost: 4 };

  it("reads leaf switches as racks under one top switch, without pods", () => {
    const file = topologyFromConf(
      "# two racks\nSwitchName=r0 Nodes=n[0-1]\nSwitchName=r1 Nodes=n[2-3] LinkSpeed=100\nSwitchName=top Switches=r[0-1]\n",
      options,
    );
    const named = parseTopologyFile(file);
    expect(named.topology).toEqual({ racks: 2, hostsPerRack: 2, gpusPerHost: 4, uplinksPerRack: 8 });
    expect(named.hostNames).toEqual(["n0", "n1", "n2", "n3"]);
  });

  it("reads the switches above the leaves as pods in a three-level tree", () => {
    const conf = [
      "switchname=s0 nodes=a[0-1]",
      "SwitchName=s1 Nodes=b[0-1]",
      "SwitchName=s2 Nodes=c[0-1]",
      "SwitchName=s3 Nodes=d[0-1]",
      "SwitchName=agg0 Switches=s[0,2]",
      "SwitchName=agg1 Switches=s[1,3]",
      "SwitchName=core Switches=agg[0-1]",
    ].join("\n");
    const named = parseTopologyFile(topologyFromConf(conf, options));
    expect(named.topology.racksPerPod).toBe(2);
    expect(named.rackNames).toEqual(["s0", "s2", "s1", "s3"]);
    expect(named.podNames).toEqual(["agg0", "agg1"]);
    expect(hostIndexOf(named, "c1")).toBe(3);
  });

  it("refuses lines it cannot read, naming the line", () => {
    expect(rejection(() => topologyFromConf("SwitchName=a Nodes=n0\nNodes=n1\n", options, "topology t.conf"))).toBe(
      "topology t.conf at line 2: every line of topology.conf starts with SwitchName=NAME",
    );
    expect(rejection(() => topologyFromConf("SwitchName=top Switches=r0\n", options))).toMatch(/line 1: switch "top" names switch "r0", which no line defines/);
    expect(rejection(() => topologyFromConf("SwitchName=a Nodes=n[0-\n", options))).toMatch(/line 1: hostlist/);
    expect(rejection(() => topologyFromConf("SwitchName=a Nodes=n0 oops\n", options))).toMatch(/"oops" is not KEY=VALUE/);
    expect(rejection(() => topologyFromConf("SwitchName=top\n", options))).toMatch(/no switch lists Nodes=/);
  });
});
