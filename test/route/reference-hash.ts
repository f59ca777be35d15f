import type { FiveTuple, Tier } from "../../controller/planner/route/index.ts";

/**
 * The default switch model rebuilt from its definition, sharing no code with it: the tuple
 * laid out big-endian by a DataView (source address, destination address, protocol, source
 * port, destination port: 13 bytes), a bit-at-a-time reflected CRC-32 with the tier's
 * polynomial, modulo the number of next hops.
 */
const POLYNOMIAL: Record<Tier, number> = { tor: 0xedb88320, aggregation: 0x82f63b78, core: 0xeb31d82e };

export function referenceBytes(tuple: FiveTuple): Uint8Array {
  const bytes = new Uint8Array(13);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, tuple.srcAddress);
  view.setUint32(4, tuple.dstAddress);
  view.setUint8(8, tuple.protocol);
  view.setUint16(9, tuple.srcPort);
  view.setUint16(11, tuple.dstPort);
  return bytes;
}

export function referenceCrc(bytes: Uint8Array, tier: Tier): number {
  let c = 0xffffffff;
  for (const byte of bytes) {
    c ^= byte;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLYNOMIAL[tier] : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

export const referenceHop = (tuple: FiveTuple, members: number, tier: Tier): number => referenceCrc(referenceBytes(tuple), tier) % members;
