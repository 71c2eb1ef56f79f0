"""Node resource managers: the shells that apply core/ resource decisions to the host (cgroups)."""
