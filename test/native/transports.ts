import { capabilities, type Transport } from "../../native/index.ts";

/**
 * The transports the transfer suites run over: TCP everywhere, RDMA too where this host has a
 * usable device (`npm run test:rdma` provides one: a soft-RoCE device in a virtual machine).
 * MONKEYTREE_REQUIRE_RDMA=1 makes a missing device an error instead of a smaller list.
 */
export const transports: readonly Transport[] = (() => {
  const { rdma } = capabilities();
  if (process.env.MONKEYTREE_REQUIRE_RDMA === "1" && !rdma.available) {
    throw new Error(`MONKEYTREE_REQUIRE_RDMA=1 but RDMA is unavailable here: ${rdma.reason ?? "not compiled"}`);
  }
  return rdma.available ? ["tcp", "rdma"] : ["tcp"];
})();
