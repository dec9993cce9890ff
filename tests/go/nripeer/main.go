// nripeer is the runtime side of NRI as containerd runs it: the real pkg/adaptation code of
// github.com/containerd/nri, listening on a socket, driving whatever plugin connects.
//
// Script mode (-script FILE): the script's pods and containers are the node the plugin is synchronized
// with; then each step (RunPodSandbox, CreateContainer, UpdateContainer, StopContainer, RemovePodSandbox)
// is sent through adaptation and the responses are printed as one JSON document on stdout.
//
// Bench mode (-bench N): after one RunPodSandbox, N CreateContainer calls for containers of that pod,
// each timed around adaptation.CreateContainer (so the runtime's own encoding, ttrpc, merging and the
// plugin's work are all inside); prints {"ns": [...]} on stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type step struct {
	Call      string          `json:"call"`
	Pod       string          `json:"pod"`       // pod id
	Container json.RawMessage `json:"container"` // protojson api.Container (Create) or a container id string
	Resources json.RawMessage `json:"resources"` // protojson api.LinuxResources (UpdateContainer)
}

type script struct {
	Pods       []json.RawMessage `json:"pods"`
	Containers []json.RawMessage `json:"containers"`
	Steps      []step            `json:"steps"`
}

type result struct {
	Call     string          `json:"call"`
	Response json.RawMessage `json:"response,omitempty"`
	Error    string          `json:"error,omitempty"`
}

type output struct {
	Plugins            int             `json:"synchronized_plugins"`
	SyncUpdates        json.RawMessage `json:"synchronize_updates"`
	Results            []result        `json:"results"`
	UnsolicitedUpdates json.RawMessage `json:"unsolicited_updates"`
}

var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false}

func toJSON(m proto.Message) json.RawMessage {
	b, err := marshal.Marshal(m)
	if err != nil {
		return json.RawMessage(fmt.Sprintf("%q", err.Error()))
	}
	return b
}

func listJSON(updates []*api.ContainerUpdate) json.RawMessage {
	out := []json.RawMessage{}
	for _, u := range updates {
		out = append(out, toJSON(u))
	}
	b, _ := json.Marshal(out)
	return b
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nripeer: "+format+"\n", args...)
	os.Exit(2)
}

// node is the runtime's view, filled from the script and kept current by the steps.
type node struct {
	pods       map[string]*api.PodSandbox
	containers map[string]*api.Container
	order      []string
}

func (n *node) podList() []*api.PodSandbox {
	out := []*api.PodSandbox{}
	for _, p := range n.pods {
		out = append(out, p)
	}
	return out
}

func (n *node) containerList() []*api.Container {
	out := []*api.Container{}
	for _, id := range n.order {
		if c, ok := n.containers[id]; ok {
			out = append(out, c)
		}
	}
	return out
}

// pluginCount is the adaptation's metrics hook, used to learn when a plugin has joined the active set.
type pluginCount struct{ active chan int }

func (p *pluginCount) RecordPluginInvocation(string, string, error)      {}
func (p *pluginCount) RecordPluginLatency(string, string, time.Duration) {}
func (p *pluginCount) UpdatePluginCount(count int) {
	select { // called after every event too: never block the runtime on it
	case p.active <- count:
	default:
	}
}
func (p *pluginCount) RecordPluginAdjustments(string, string, *nri.ContainerAdjustment, int, int) {}

func main() {
	socket := flag.String("socket", "", "NRI socket to listen on")
	scriptPath := flag.String("script", "", "script mode: JSON scenario")
	benchN := flag.Int("bench", 0, "bench mode: number of CreateContainer calls")
	distinct := flag.Bool("distinct", false, "bench mode: a new container for every call (the one created 16 calls earlier is removed, untimed)")
	wait := flag.Duration("wait", 60*time.Second, "how long to wait for a plugin to connect")
	flag.Parse()
	if *socket == "" || (*scriptPath == "") == (*benchN == 0) {
		fail("usage: nripeer -socket PATH (-script FILE | -bench N)")
	}

	n := &node{pods: map[string]*api.PodSandbox{}, containers: map[string]*api.Container{}}
	var sc script
	if *scriptPath != "" {
		raw, err := os.ReadFile(*scriptPath)
		if err != nil {
			fail("%v", err)
		}
		if err := json.Unmarshal(raw, &sc); err != nil {
			fail("script: %v", err)
		}
		for _, p := range sc.Pods {
			pod := &api.PodSandbox{}
			if err := protojson.Unmarshal(p, pod); err != nil {
				fail("script pod: %v", err)
			}
			n.pods[pod.Id] = pod
		}
		for _, c := range sc.Containers {
			ctr := &api.Container{}
			if err := protojson.Unmarshal(c, ctr); err != nil {
				fail("script container: %v", err)
			}
			n.containers[ctr.Id] = ctr
			n.order = append(n.order, ctr.Id)
		}
	}

	// syncFn runs once at Start (for pre-launched plugins: none here) and once per connecting plugin
	var syncMu sync.Mutex
	var syncs [][]*api.ContainerUpdate
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		updates, err := cb(ctx, n.podList(), n.containerList())
		if err == nil {
			syncMu.Lock()
			syncs = append(syncs, updates)
			syncMu.Unlock()
		}
		return err
	}
	var unsolicited []*api.ContainerUpdate
	updateFn := func(_ context.Context, u []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
		unsolicited = append(unsolicited, u...)
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "nripeer-")
	if err != nil {
		fail("%v", err)
	}
	defer os.RemoveAll(dir)
	joined := &pluginCount{active: make(chan int, 16)}
	r, err := nri.New("nripeer", "v0.1", syncFn, updateFn, nri.WithSocketPath(*socket),
		nri.WithPluginPath(dir), nri.WithPluginConfigPath(dir), nri.WithMetrics(joined))
	if err != nil {
		fail("adaptation: %v", err)
	}
	if err := r.Start(); err != nil {
		fail("adaptation start: %v", err)
	}
	defer r.Stop()
	fmt.Fprintln(os.Stderr, "nripeer: listening on", *socket)

	// the plugin joins the active set right after its Synchronize returned
	deadline := time.After(*wait)
	for count := 0; count < 1; {
		select {
		case count = <-joined.active:
		case <-deadline:
			fail("no plugin connected within %v", *wait)
		}
	}
	syncMu.Lock()
	syncUpdates := syncs[len(syncs)-1]
	syncMu.Unlock()
	ctx := context.Background()
	if *benchN > 0 {
		bench(ctx, r, *benchN, *distinct)
		return
	}
	out := output{Plugins: 1, SyncUpdates: listJSON(syncUpdates), Results: []result{}}
	for _, st := range sc.Steps {
		out.Results = append(out.Results, run(ctx, r, n, st))
	}
	out.UnsolicitedUpdates = listJSON(unsolicited)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fail("%v", err)
	}
}

func run(ctx context.Context, r *nri.Adaptation, n *node, st step) result {
	res := result{Call: st.Call}
	pod, ok := n.pods[st.Pod]
	if !ok {
		res.Error = "unknown pod " + st.Pod
		return res
	}
	errText := func(err error) string {
		if err != nil {
			return err.Error()
		}
		return ""
	}
	switch st.Call {
	case "RunPodSandbox":
		res.Error = errText(r.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}))
	case "RemovePodSandbox":
		res.Error = errText(r.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod}))
		delete(n.pods, pod.Id)
	case "CreateContainer":
		ctr := &api.Container{}
		if err := protojson.Unmarshal(st.Container, ctr); err != nil {
			res.Error = "bad container: " + err.Error()
			return res
		}
		resp, err := r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
		res.Error = errText(err)
		if resp != nil {
			res.Response = toJSON(resp)
		}
		ctr.State = api.ContainerState_CONTAINER_CREATED
		n.containers[ctr.Id] = ctr
		n.order = append(n.order, ctr.Id)
	case "UpdateContainer", "StopContainer":
		var id string
		if err := json.Unmarshal(st.Container, &id); err != nil {
			res.Error = "container must be an id: " + err.Error()
			return res
		}
		ctr, ok := n.containers[id]
		if !ok {
			res.Error = "unknown container " + id
			return res
		}
		if st.Call == "StopContainer" {
			resp, err := r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr})
			res.Error = errText(err)
			if resp != nil {
				res.Response = toJSON(resp)
			}
			return res
		}
		lr := &api.LinuxResources{}
		if len(st.Resources) > 0 {
			if err := protojson.Unmarshal(st.Resources, lr); err != nil {
				res.Error = "bad resources: " + err.Error()
				return res
			}
		}
		resp, err := r.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: ctr, LinuxResources: lr})
		res.Error = errText(err)
		if resp != nil {
			res.Response = toJSON(resp)
		}
	default:
		res.Error = "unknown call " + st.Call
	}
	return res
}
