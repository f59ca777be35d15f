import { randomUUID } from "node:crypto";
import { createServer, type AddressInfo } from "node:net";

/** A TCP port nothing listens on right now, for a process group's rendezvous. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * torchrun arguments for a one-node job whose rendezvous store listens on a port of its own.
 * `--standalone` in torch 1.13 always uses localhost:29400, so two such runs on one machine
 * (two test files, or a test beside another user's job) fail to bind.
 */
export async function localRendezvous(): Promise<string[]> {
  return ["--nnodes=1", "--rdzv_backend=c10d", `--rdzv_endpoint=127.0.0.1:${await freePort()}`, `--rdzv_id=${randomUUID()}`];
}
