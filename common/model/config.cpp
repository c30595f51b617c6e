// Filled by the config work (issue 2).
