// Filled by the CPU backend work (issue 2).
