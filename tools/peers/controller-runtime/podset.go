// The PodSet resource both sample controllers reconcile (Petrel's under
// examples/ and this one): bench.petrel.dev/v1 PodSet{replicas, template},
// status{replicas, observedGeneration}. Its CRD is crd.yaml beside this file.
package main

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the PodSet's API group and version.
var GroupVersion = schema.GroupVersion{Group: "bench.petrel.dev", Version: "v1"}

// PodSetSpec is what the user asks for: that many Pods from the template.
type PodSetSpec struct {
	Replicas int32                  `json:"replicas"`
	Template corev1.PodTemplateSpec `json:"template"`
}

// PodSetStatus is what the controller observed.
type PodSetStatus struct {
	Replicas           int32 `json:"replicas"`
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// PodSet keeps spec.replicas Pods from spec.template, owned by it.
type PodSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodSetSpec   `json:"spec"`
	Status            PodSetStatus `json:"status,omitempty"`
}

// PodSetList is a list of PodSets.
type PodSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodSet `json:"items"`
}

// DeepCopyObject copies the PodSet (written by hand: no code generator here).
func (p *PodSet) DeepCopyObject() runtime.Object {
	out := &PodSet{TypeMeta: p.TypeMeta, Status: p.Status}
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Replicas = p.Spec.Replicas
	p.Spec.Template.DeepCopyInto(&out.Spec.Template)
	return out
}

// DeepCopyObject copies the list.
func (l *PodSetList) DeepCopyObject() runtime.Object {
	out := &PodSetList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]PodSet, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].DeepCopyObject().(*PodSet)
		}
	}
	return out
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &PodSet{}, &PodSetList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
