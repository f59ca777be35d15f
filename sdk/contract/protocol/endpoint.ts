import { transferTicketSchema, type TransferTicket } from "../../../native/index.ts";
import { quote } from "../errors.ts";
import { MAX_ADDRESS_LENGTH, textSchema } from "./limits.ts";

/**
 * A host's transfer engine as the control plane names it: `tcp://HOST:PORT` (an IPv6 literal in
 * brackets), with `?rdma` when its grants also accept RDMA WRITEs. The handshake is TCP either way.
 */
export interface TransferEndpoint {
  host: string;
  port: number;
  rdma: boolean;
}

const FORMAT = /^tcp:\/\/(?:\[([^\]]+)\]|([^:/?[\]]+)):(\d{1,5})(\?rdma)?$/;

export function formatTransferEndpoint({ host, port, rdma }: TransferEndpoint): string {
  return `tcp://${host.includes(":") ? `[${host}]` : host}:${port}${rdma ? "?rdma" : ""}`;
}

/** Null for anything but `tcp://HOST:PORT[?rdma]` with a port in 1–65535. */
export function parseTransferEndpoint(endpoint: string): TransferEndpoint | null {
  const match = FORMAT.exec(endpoint);
  const host = match?.[1] ?? match?.[2];
  const port = Number(match?.[3]);
  if (!host || !(port >= 1 && port <= 65535)) return null;
  return { host, port, rdma: match?.[4] !== undefined };
}

export const TransferEndpointSchema = textSchema("endpoint", MAX_ADDRESS_LENGTH).refine((endpoint) => parseTransferEndpoint(endpoint) !== null, {
  error: "endpoint must be tcp://HOST:PORT, or tcp://HOST:PORT?rdma when the host accepts RDMA WRITEs",
});

/** What a source needs for `send()`, rebuilt from a `migrate-out` directive and its checkpoint size. */
export function ticketFor(endpoint: string, token: string, length: number): TransferTicket {
  const parsed = parseTransferEndpoint(endpoint);
  if (!parsed) throw new TypeError(`endpoint must be tcp://HOST:PORT[?rdma], got ${quote(endpoint)}`);
  return transferTicketSchema.parse({ host: parsed.host, port: parsed.port, token, length, ...(parsed.rdma ? { rdma: true } : {}) });
}
