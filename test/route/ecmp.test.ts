import { describe, expect, it } from "vitest";
import {
  crc32,
  crc32HashModel,
  EPHEMERAL_PORTS,
  ROCE_V2_PORT,
  routeCluster,
  SCAN_ORDER,
  steerPorts,
  tupleBytes,
  defaultAddressOf,
  type Tier,
  type SwitchHashModel,
} from "../../controller/planner/route/index.ts";
import { referenceBytes, referenceCrc, referenceHop } from "./reference-hash.ts";
import { syntheticCluster } from "../../controller/simulator/synthetic.ts";

const ascii = (s: string) => new TextEncoder().encode(s);

describe("crc32", () => {
  it("matches the catalogued check values of each tier's polynomial", () => {
    expect(crc32(ascii("123456789"), "tor")).toBe(0xcbf43926); // CRC-32/ISO-HDLC
    expect(crc32(ascii("123456789"), "aggregation")).toBe(0xe3069283); // CRC-32/ISCSI
    expect(crc32(ascii("123456789"), "core")).toBe(0x2d3dd0ae); // CRC-32/KOOPMAN
  });
});

// Catalogued outside this code base: the bytes written by hand from the layout (addresses,
// protocol, source port, destination port, big-endian), the CRCs by Python's zlib.crc32 (tor)
// and a bit-at-a-time CRC whose check values match the catalogue's (all three tiers).
const CATALOGUE = [
  {
    tuple: { srcAddress: 0x0a000001, dstAddress: 0x0a000002, protocol: 17, srcPort: 49152, dstPort: ROCE_V2_PORT },
    bytes: "0a000001 0a000002 11 c000 12b7",
    crc: { tor: 0x043366c7, aggregation: 0x2bd0dc8d, core: 0x3f532cdc },
    of16: { tor: 7, aggregation: 13, core: 12 },
    of7: { tor: 6, aggregation: 3, core: 2 },
  },
  {
    // An address with its top bit set: the layout must not go through a signed 32-bit value.
    tuple: { srcAddress: 0xc0a80114, dstAddress: 0x0a010203, protocol: 17, srcPort: 65535, dstPort: ROCE_V2_PORT },
    bytes: "c0a80114 0a010203 11 ffff 12b7",
    crc: { tor: 0xdbc1fddf, aggregation: 0x6c671426, core: 0x7ff29d04 },
    of16: { tor: 15, aggregation: 6, core: 4 },
    of7: { tor: 6, aggregation: 5, core: 4 },
  },
  {
    // Every field distinct and no port symmetric, so a swapped field or byte order shows.
    tuple: { srcAddress: 0x0a0000ff, dstAddress: 0xac100001, protocol: 6, srcPort: 0x1234, dstPort: 0xabcd },
    bytes: "0a0000ff ac100001 06 1234 abcd",
    crc: { tor: 0x9f0f9811, aggregation: 0x6ec66f42, core: 0x5a39e5c3 },
    of16: { tor: 1, aggregation: 2, core: 3 },
    of7: { tor: 2, aggregation: 1, core: 6 },
  },
] as const;

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");
const unspaced = (spaced: string) => Buffer.from(spaced.replaceAll(" ", ""), "hex");
const TIERS = ["tor", "aggregation", "core"] as const;

describe("the 5-tuple hash, pinned to catalogued values", () => {
  it.each(CATALOGUE)("lays out $bytes", ({ tuple, bytes }) => {
    expect(hex(tupleBytes(tuple))).toBe(hex(unspaced(bytes)));
    expect(hex(referenceBytes(tuple))).toBe(hex(unspaced(bytes)));
  });

  it.each(CATALOGUE)("hashes $bytes to the catalogued CRC and next hop on every tier", ({ tuple, bytes, crc, of16, of7 }) => {
    const model = crc32HashModel();
    for (const tier of TIERS) {
      expect(crc32(unspaced(bytes), tier), tier).toBe(crc[tier]);
      expect(referenceCrc(unspaced(bytes), tier), tier).toBe(crc[tier]);
      expect(model.select(tuple, 16, tier), tier).toBe(of16[tier]);
      expect(model.select(tuple, 7, tier), tier).toBe(of7[tier]);
    }
  });

  it("the reference implementation matches the catalogue's check values", () => {
    expect(referenceCrc(ascii("123456789"), "tor")).toBe(0xcbf43926);
    expect(referenceCrc(ascii("123456789"), "aggregation")).toBe(0xe3069283);
    expect(referenceCrc(ascii("123456789"), "core")).toBe(0x2d3dd0ae);
  });
});

describe("crc32HashModel", () => {
  it("agrees with hashing the whole tuple from scratch while flows and tiers alternate", () => {
    const model = crc32HashModel();
    const tiers: Tier[] = ["tor", "aggregation", "core"];
    for (let i = 0; i < 3000; i++) {
      const tuple = { srcAddress: (i * 7919) % 5, dstAddress: 0x0a000000 + (i % 3), protocol: 17, srcPort: 49152 + i, dstPort: ROCE_V2_PORT };
      const tier = tiers[i % 3]!;
      expect(model.select(tuple, 7, tier)).toBe(referenceHop(tuple, 7, tier));
    }
  });
});

describe("source-port steering", () => {
  it("tries every ephemeral port exactly once", () => {
    expect(SCAN_ORDER).toHaveLength(EPHEMERAL_PORTS.last - EPHEMERAL_PORTS.first + 1);
    expect([...SCAN_ORDER].sort((a, b) => a - b)).toEqual(Array.from(SCAN_ORDER, (_, i) => EPHEMERAL_PORTS.first + i));
  });

  it("picks, for every DP and PP flow, an ephemeral port that hashes onto its uplink", () => {
    for (let seed = 1; seed <= 10; seed++) {
      const cluster = syntheticCluster({ racks: 16, hostsPerRack: 8, uplinksPerRack: 16, rings: 8, maxSpan: 6 }, seed);
      const routes = routeCluster(cluster);
      expect(routes.unsteered).toBe(0);
      for (const f of [...routes.dpFlows, ...routes.ppFlows]) {
        const port = f.sourcePort!;
        expect(port).toBeGreaterThanOrEqual(EPHEMERAL_PORTS.first);
        expect(port).toBeLessThanOrEqual(EPHEMERAL_PORTS.last);
        const tuple = {
          srcAddress: defaultAddressOf(f.srcHost),
          dstAddress: defaultAddressOf(f.dstHost),
          protocol: 17,
          srcPort: port,
          dstPort: ROCE_V2_PORT,
        };
        expect(referenceHop(tuple, 16, "tor")).toBe(f.uplink);
      }
    }
  });

  it("gives the flows of one host distinct ports", () => {
    const cluster = syntheticCluster({ racks: 16, hostsPerRack: 8, uplinksPerRack: 16, rings: 8, maxSpan: 6 }, 4);
    const routes = routeCluster(cluster);
    const bySource = new Map<number, number[]>();
    for (const f of [...routes.dpFlows, ...routes.ppFlows]) bySource.set(f.srcHost, [...(bySource.get(f.srcHost) ?? []), f.sourcePort!]);
    expect([...bySource.values()].some((ports) => ports.length > 1)).toBe(true);
    for (const ports of bySource.values()) expect(new Set(ports).size).toBe(ports.length);
  });

  it("uses whatever switch model it is given", () => {
    // A switch that hashes only the source port: the first untaken port ≡ member (mod members).
    const byPort: SwitchHashModel = { name: "port-mod", select: (t, members) => t.srcPort % members };
    const ports = steerPorts(
      [
        { srcAddress: 1, dstAddress: 2, hops: [{ tier: "tor", members: 4, member: 3 }] },
        { srcAddress: 1, dstAddress: 3, hops: [{ tier: "tor", members: 4, member: 3 }] },
        { srcAddress: 5, dstAddress: 3, hops: [{ tier: "tor", members: 4, member: 3 }] },
      ],
      byPort,
    );
    const fitting = SCAN_ORDER.filter((p) => p % 4 === 3);
    expect(ports).toEqual([fitting[0], fitting[1], fitting[0]]);
  });

  it("reports null when no port reaches the path, and reuses a port only when nothing else fits", () => {
    const stuck: SwitchHashModel = { name: "constant", select: () => 0 };
    const hop = (member: number) => [{ tier: "tor" as const, members: 2, member }];
    const ports = steerPorts(
      [
        { srcAddress: 1, dstAddress: 2, hops: hop(1) },
        { srcAddress: 1, dstAddress: 2, hops: hop(0) },
      ],
      stuck,
    );
    expect(ports).toEqual([null, SCAN_ORDER[0]]);
    const onePort: SwitchHashModel = { name: "one port", select: (t) => (t.srcPort === 50000 ? 1 : 0) };
    expect(
      steerPorts(
        [
          { srcAddress: 1, dstAddress: 2, hops: hop(1) },
          { srcAddress: 1, dstAddress: 3, hops: hop(1) },
        ],
        onePort,
      ),
    ).toEqual([50000, 50000]);
  });
});
