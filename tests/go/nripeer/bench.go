package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

// benchPod is a BE pod with batch resources, as the kubelet and koordinator's webhook describe it.
func benchPod() *api.PodSandbox {
	uid := "0b3e2c1a-bench-4e2a-9c1d-000000000001"
	return &api.PodSandbox{
		Id:        "bench-sandbox",
		Name:      "bench",
		Uid:       uid,
		Namespace: "bench",
		Labels:    map[string]string{"koordinator.sh/qosClass": "BE"},
		Annotations: map[string]string{
			"node.koordinator.sh/extended-resource-spec": `{"containers":{"main":{` +
				`"requests":{"kubernetes.io/batch-cpu":"1500","kubernetes.io/batch-memory":"268435456"},` +
				`"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"268435456"}}}}`,
		},
		Linux: &api.LinuxPodSandbox{CgroupParent: "/kubepods/besteffort/pod" + uid},
	}
}

func benchContainer(pod *api.PodSandbox, i int) *api.Container {
	id := fmt.Sprintf("%064x", i+1)
	return &api.Container{
		Id:           id,
		PodSandboxId: pod.Id,
		Name:         "main",
		State:        api.ContainerState_CONTAINER_UNKNOWN,
		Env:          []string{"PATH=/bin"},
		Linux: &api.LinuxContainer{
			CgroupsPath: pod.Linux.CgroupParent + "/" + id,
			Resources: &api.LinuxResources{
				Cpu:    &api.LinuxCPU{Shares: api.UInt64(2), Period: api.UInt64(100000)},
				Memory: &api.LinuxMemory{},
			},
		},
	}
}

// bench times `calls` CreateContainer calls. Without `distinct` 16 container ids take turns (the plugin sees
// the same containers again); with it every call creates a new container, as on a real node, and the one
// created 16 calls earlier is removed after the timed call, so the pod never holds more than 16.
func bench(ctx context.Context, r *nri.Adaptation, calls int, distinct bool) {
	pod := benchPod()
	if err := r.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}); err != nil {
		fail("RunPodSandbox: %v", err)
	}
	ns := make([]int64, 0, calls)
	adjusted := 0
	for i := 0; i < calls; i++ {
		n := i % 16 // 16 container ids in turn, as bench/nri.py: a pod never has 2000
		if distinct {
			n = i
		}
		ctr := benchContainer(pod, n)
		t0 := time.Now()
		resp, err := r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
		ns = append(ns, time.Since(t0).Nanoseconds())
		if err != nil {
			fail("CreateContainer %d: %v", i, err)
		}
		if resp.GetAdjust().GetLinux().GetResources().GetCpu().GetShares() != nil {
			adjusted++
		}
		if distinct && i >= 16 {
			old := &api.RemoveContainerRequest{Pod: pod, Container: benchContainer(pod, i-16)}
			if err := r.RemoveContainer(ctx, old); err != nil {
				fail("RemoveContainer %d: %v", i-16, err)
			}
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(map[string]any{"ns": ns, "adjusted": adjusted}); err != nil {
		fail("%v", err)
	}
}
