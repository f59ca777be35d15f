export * from "./snapshot.ts";
export * from "../../../sdk/contract/errors.ts";
export * from "./cluster.ts";
export * from "./fragmentation.ts";
