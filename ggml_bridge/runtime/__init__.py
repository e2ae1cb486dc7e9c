"""Running llama-server and proving what engaged: the modes and mechanisms, the log parser and the engagement decision, one server process, the launcher, rpc-servers, the link shaper."""
