// leader-elect: a client-go leader-election candidate on a Lease, for
// Petrel's compatibility test (tests/e2e/tests/e2e_leader.rs). It campaigns
// with client-go's leaderelection package and prints one line per event on
// stdout:
//
//	lead <unix nanoseconds>   became leader (after the Lease was written)
//	stop <unix nanoseconds>   stopped leading (printed before the Lease is released)
//
// SIGTERM or SIGINT ends the candidacy: the worker stops ("stop" is printed
// first), then client-go releases the Lease (ReleaseOnCancel) and the
// program exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// clientGoVersion is the k8s.io/client-go this binary was built with, as
// its build information records it.
func clientGoVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "k8s.io/client-go" {
				return m.Version
			}
		}
	}
	return "(unknown)"
}

// events serialises the output lines and remembers whether we lead.
type events struct {
	mu      sync.Mutex
	leading bool
}

func (e *events) lead() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading {
		e.leading = true
		fmt.Printf("lead %d\n", time.Now().UnixNano())
	}
}

func (e *events) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leading {
		e.leading = false
		fmt.Printf("stop %d\n", time.Now().UnixNano())
	}
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "default", "the Lease's namespace")
	name := flag.String("name", "", "the Lease's name")
	identity := flag.String("identity", "", "this candidate's holderIdentity")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	version := flag.Bool("version", false, "print the client-go version and exit")
	klog.InitFlags(nil)
	flag.Parse()
	if *version {
		fmt.Printf("leader-elect client-go %s\n", clientGoVersion())
		return
	}
	if *name == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "leader-elect: --name and --identity are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leader-elect: kubeconfig %s: %v\n", *kubeconfig, err)
		os.Exit(1)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	ev := &events{}
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		// The worker stops before client-go releases the Lease.
		ev.stop()
		cancel()
	}()
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: true,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { ev.lead() },
			OnStoppedLeading: ev.stop,
		},
	})
}
