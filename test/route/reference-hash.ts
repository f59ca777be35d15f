import { crc32, tupleBytes, type FiveTuple, type Tier } from "../../controller/route/index.ts";

/** The next hop a switch of `tier` picks under the default model, hashed from scratch (no cached prefix). */
export const referenceHop = (tuple: FiveTuple, members: number, tier: Tier): number => crc32(tupleBytes(tuple), tier) % members;
