// stubplugin is the speed yardstick for koordqos's NRI plugin: a compiled plugin on the reference client
// library (github.com/containerd/nri pkg/stub) doing the same essential CreateContainer work for a BE pod:
// read koordinator's extended-resource-spec annotation and put the container's batch CPU shares, CFS quota
// and memory limit into the adjustment. With -track it also keeps the set of containers it created and
// subscribes to RemoveContainer to drop them, as a plugin that follows the node's containers must (koordqos
// does): the runtime then calls it on every removal too.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

const extSpec = "node.koordinator.sh/extended-resource-spec"

type resources struct {
	Requests map[string]string `json:"requests"`
	Limits   map[string]string `json:"limits"`
}

type plugin struct{}

func (plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	var spec struct {
		Containers map[string]resources `json:"containers"`
	}
	if raw, ok := pod.Annotations[extSpec]; ok && json.Unmarshal([]byte(raw), &spec) == nil {
		if res, ok := spec.Containers[ctr.Name]; ok {
			if v, err := strconv.ParseInt(res.Requests["kubernetes.io/batch-cpu"], 10, 64); err == nil {
				adj.SetLinuxCPUShares(uint64(v * 1024 / 1000))
			}
			if v, err := strconv.ParseInt(res.Limits["kubernetes.io/batch-cpu"], 10, 64); err == nil {
				adj.SetLinuxCPUQuota(v * 100) // milli-cores × 100000 µs period / 1000
			}
			if v, err := strconv.ParseInt(res.Limits["kubernetes.io/batch-memory"], 10, 64); err == nil {
				adj.SetLinuxMemoryLimit(v)
			}
		}
	}
	return adj, nil, nil
}

// tracker is the plugin with the node's containers kept: RemoveContainer is implemented, so pkg/stub
// subscribes to it.
type tracker struct {
	plugin
	mu  sync.Mutex
	ids map[string]struct{}
}

func (t *tracker) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	t.mu.Lock()
	t.ids[ctr.Id] = struct{}{}
	t.mu.Unlock()
	return t.plugin.CreateContainer(ctx, pod, ctr)
}

func (t *tracker) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	t.mu.Lock()
	delete(t.ids, ctr.Id)
	t.mu.Unlock()
	return nil
}

func main() {
	socket := flag.String("socket", "", "NRI socket")
	name := flag.String("name", "stubplugin", "plugin name")
	idx := flag.String("idx", "00", "plugin index")
	track := flag.Bool("track", false, "also keep the containers, subscribed to RemoveContainer")
	flag.Parse()
	var p interface{} = plugin{}
	if *track {
		p = &tracker{ids: map[string]struct{}{}}
	}
	s, err := stub.New(p, stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx(*idx))
	if err != nil {
		fmt.Fprintln(os.Stderr, "stubplugin:", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "stubplugin:", err)
		os.Exit(1)
	}
}
