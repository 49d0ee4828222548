"""The docker backend: every rank in its own container, wired to the same switch as netns.

The network is `chaos.topology`'s layout, the netns backend's, so every fault lands the same
way:

    chaos-<run>-sw          the switch namespace: bridge br0 (10.77.0.1/16) with the control
                            plane (TCPStore, `harness.job.control`, started by the rank launcher
                            with setns) and one port p<rank> per container
    chaos-<run>-r<NNN>      one container per rank, created from the rank template of
                            docker-compose.yml (`x-rank`), with network_mode "none"; once it
                            runs, the harness finds its namespace (State.Pid ->
                            /proc/PID/ns/net), pins it under this name (as `ip netns attach`
                            does: the host outlives the rank's process, as a netns host
                            does) and moves the other end of the veth in as eth0 with
                            10.77.x.y/16. The rank (`python -m harness.cluster.container rank
                            --config --barrier`) loads torch, waits until eth0 is up with an
                            address and until every rank has loaded (ready files in the run
                            folder: containers start one by one, each importing torch for
                            seconds), then joins the rendezvous like a forked netns rank.

No docker network is created: the switch namespace is the network. `chaos/` never imports
docker. One module per concern:

    engine      the client, docker SDK errors translated once (HarnessError), the labels
    template    the compose file's rank template -> the engine's create options
    image       which image the ranks run; the local test image for engines without a registry
    heal        the undo ops (``docker_container``, ``docker_unpause``) and the heal sweep of
                labelled containers, as one plain table (`UNDOS`)
    mechanisms  kill and pause through the engine
    cluster     `DockerCluster` and `DockerBackend`
    __main__    `python -m harness.cluster.docker image|heal|check`

The docker SDK is imported lazily: every module imports without it.
"""
