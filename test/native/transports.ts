import type { Transport } from "../../native/index.ts";
import { canRun, rdmaDevice } from "../helpers/prerequisites.ts";

/**
 * The transports the transfer suites run over: TCP everywhere, RDMA too where this host has a
 * usable device (`npm run test:rdma` provides one: a soft-RoCE device in a virtual machine).
 */
export function transportsFor(suite: string): readonly Transport[] {
  return canRun(`${suite} over RDMA`, rdmaDevice()) ? ["tcp", "rdma"] : ["tcp"];
}
