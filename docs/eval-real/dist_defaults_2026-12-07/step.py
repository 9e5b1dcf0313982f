import sys, array, math
V=151936
def rd(p):
    a=array.array('f'); a.frombytes(open(p,'rb').read()); return a
A=rd(sys.argv[1])
for f in sys.argv[2:]:
    B=rd(f); out=[]
    for s in range(len(A)//V):
        a=A[s*V:(s+1)*V]; b=B[s*V:(s+1)*V]
        rms=math.sqrt(sum(x*x for x in a)/V)
        out.append("%.1e"%max(abs(x-y)/(abs(x)+rms) for x,y in zip(a,b)))
    print(f, " ".join(out))
