import { randomUUID } from "node:crypto";
import { unusedPort } from "../../sdk/launch/ports.ts";

/** A TCP port nothing listens on right now, below the ephemeral range (see sdk/launch/ports.ts). */
export const freePort = unusedPort;

/**
 * torchrun arguments for a one-node job whose rendezvous store listens on a port of its own.
 * `--standalone` picks a port of its own, which two runs on one machine (two test files, or a
 * test beside another user's job) may race for.
 */
export async function localRendezvous(): Promise<string[]> {
  return ["--nnodes=1", "--rdzv_backend=c10d", `--rdzv_endpoint=127.0.0.1:${await freePort()}`, `--rdzv_id=${randomUUID()}`];
}
